"""The %nbdebug magic through a real IPython shell."""

import pytest
import torch
from conftest import Net
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import nbdebug
import nbdebug.debugger
from nbdebug.ui.panel import Panel
from nbdebug.ui.source import SessionSource


@pytest.fixture(scope="module")
def ip():
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbdebug")
    return shell


def test_help_lists_the_forms(ip, capsys):
    assert ip.run_line_magic("nbdebug", "help") is None
    out = capsys.readouterr().out
    assert "%nbdebug load PATH" in out and "%nbdebug help" in out and "most recent live Debugger" in out
    with pytest.raises(UsageError, match="unknown form 'frobnicate'"):
        ip.run_line_magic("nbdebug", "frobnicate")


def test_panel_of_the_last_debugger(ip, monkeypatch):
    monkeypatch.setattr(nbdebug.debugger, "_LAST", [None])
    with pytest.raises(UsageError, match="no live Debugger yet"):
        ip.run_line_magic("nbdebug", "")
    torch.manual_seed(0)
    dbg = nbdebug.Debugger(Net())
    try:
        panel = ip.run_line_magic("nbdebug", "")
        assert isinstance(panel, Panel) and panel.source.obj is dbg and panel.controls is not None
        # as a cell: the panel is the cell's result (what the notebook displays)
        res = ip.run_cell("%nbdebug")
        assert res.success and isinstance(res.result, Panel)
        panel.close()
        res.result.close()
    finally:
        dbg.close()
    with pytest.raises(UsageError, match="no live Debugger"):  # a closed debugger does not count
        ip.run_line_magic("nbdebug", "")


def test_load_shows_errors_clearly(ip, tmp_path, monkeypatch):
    missing = tmp_path / "no such dump"
    with pytest.raises(UsageError, match="load"):
        ip.run_line_magic("nbdebug", f"load '{missing}'")
    with pytest.raises(UsageError, match="one PATH"):
        ip.run_line_magic("nbdebug", "load")

    def broken(path):
        raise ValueError(f"{path}/dump.json: not valid JSON (line 3)")

    monkeypatch.setattr(nbdebug, "load", broken, raising=False)
    with pytest.raises(UsageError, match=r"ValueError: .*dump\.json: not valid JSON \(line 3\)"):
        ip.run_line_magic("nbdebug", f"load {tmp_path}")


def test_load_opens_an_offline_panel(ip, tmp_path, monkeypatch):
    from nbdebug.session.session import Session

    seen = []

    def load(path):
        seen.append(path)
        s = Session(framework="pytorch", framework_version="2", live=False)
        s.graph.add_node("Input.0", kind="input", op_type="input").order = 0
        return SessionSource(s)

    monkeypatch.setattr(nbdebug, "load", load, raising=False)
    panel = ip.run_line_magic("nbdebug", f"load '{tmp_path}/run 1'")
    assert seen == [f"{tmp_path}/run 1"]
    assert isinstance(panel, Panel) and panel.controls is None and "offline" in panel.header.state.value
    assert panel.graph_view.visible_keys() == ["Input.0"]
    panel.close()


def test_load_a_real_dump_into_the_offline_panel(ip, tmp_path):
    """%nbdebug load on an msProbe-format dump (two steps; NaN appears in step 1) opens the panel without
    training control; a TO watchpoint made in the form finds the NaN."""
    import json

    def tensor(mx, mn, mean, norm):
        return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": mx, "Min": mn,
                "Mean": mean, "Norm": norm}

    for step, out in ((0, tensor(1.0, 0.0, 0.5, 1.0)), (1, tensor("NaN", "NaN", "NaN", "NaN"))):
        d = tmp_path / f"step{step}" / "rank0"
        d.mkdir(parents=True)
        entry = {"input_args": [tensor(1.0, -1.0, 0.0, 1.4142135)], "input_kwargs": {}, "output": [out]}
        (d / "dump.json").write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch",
                                                 "dump_data_dir": None,
                                                 "data": {"Functional.relu.0.forward": entry}}))
    panel = ip.run_line_magic("nbdebug", f"load {tmp_path}")
    try:
        assert isinstance(panel, Panel) and panel.controls is None
        assert "offline" in panel.header.state.value and panel.header.step.value == "1"
        assert "Functional.relu.0.forward" in panel.graph_view.visible_keys()
        panel.watch.add.click()
        panel.watch.condition.value = "TO"
        assert panel.watch.submit() is not None
        panel.flush()
        (row,) = panel.hit_list.rows()
        assert row.children[0].description == "TO · output.0"
        (group,) = panel.hit_list.groups()
        assert "Functional.relu.0.forward</b> <small>· TO · step 1 · 1 hit" in group.children[0].value
        row.children[1].click()  # statistics-only dump: the view says so and shows the recorded statistics
        tv = panel.tensor_view
        assert tv.visible and "statistics only" in tv.error.value
        assert "<td>1</td>" in tv.stats.value  # previous step's max, from the dump's statistics
        assert panel.errors == []
    finally:
        panel.close()
