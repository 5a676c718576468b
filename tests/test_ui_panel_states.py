"""Panel correctness (issue 10): the watchpoint form's wording and validation, one step convention,
hits grouped by node with notices apart, closed and failed states, the offline step selector, and the
quickstart used through its panel."""

import json
import os
import re
from pathlib import Path

import nbformat
import torch
import torch.nn as nn
from conftest import Net, train_steps
from nbclient import NotebookClient

import nbdebug
from nbdebug.control import State
from nbdebug.lab.commands import status
from nbdebug.ui.hits import PAGE_GROUPS, ROWS_PER_GROUP, group_hits
from nbdebug.ui.panel import Panel
from nbdebug.ui.watch_panel import LABELS

REPO = Path(__file__).resolve().parents[1]
SEED_GUIDE = Path("/work/shared/seeds/000_4b2f3124108c4361.txt")


def _enabled(panel):
    return {k: not b.disabled for k, b in panel.controls.buttons().items()}


def test_form_uses_mindinsight_wording_and_checks_every_field_at_once():
    torch.manual_seed(0)
    model = Net()
    dbg = nbdebug.Debugger(model, level="L0")
    panel = Panel(dbg, recommend=False)
    try:
        wp = panel.watch
        wp.add.click()
        wp.condition.value = "TL"
        labels = {n: f.widget.children[0].children[0].value for n, f in wp.fields.items()}
        assert "Average of the absolute value &gt;" in labels["abs_mean_gt"] and "max &gt;" in labels["max_gt"]
        for cond, name, words in (("TZ", "zero_percentage_ge", "Percentage of 0 values ≥"),
                                  ("TS", "min_lt", "min &lt;"),
                                  ("TR", "range_start_inclusive", "Lower limit of the range (inclusive)"),
                                  ("WCL", "abs_mean_update_ratio_gt", "Average change ratio &gt;"),
                                  ("WNC", "rtol", "Relative tolerance")):
            wp.condition.value = cond
            assert words in wp.fields[name].widget.children[0].children[0].value, (cond, name)
        if SEED_GUIDE.exists():  # every label is the guide's wording (spacing aside)
            guide = SEED_GUIDE.read_text().replace(" ", "").lower()
            temporal = ("field", "factor", "window", "z", "below", "steps")  # SPIKE/DRIFT/STALL: not MindInsight's
            for name, text in LABELS.items():
                if name not in ("epsilon", "atol", "equal_nan") + temporal:  # the guide names these in formulas
                    assert text.replace(" ", "").lower() in guide, text

        # three bad fields: three messages at once, each under its own field, nothing created
        wp.condition.value = "TL"
        wp.field("abs_mean_gt").value = "-1"
        wp.field("max_gt").value = "big"
        wp.field("min_gt").value = "inf"
        wp.field("mean_gt").value = "0.5"
        wp.create.click()
        errs = wp.errors()
        assert set(errs) == {"abs_mean_gt", "max_gt", "min_gt"}, errs
        assert "must be >= 0, got -1" in errs["abs_mean_gt"] and "must be a number" in errs["max_gt"]
        assert "finite" in errs["min_gt"]
        assert not dbg.watchpoints.watchpoints and wp.form_open
        assert wp.field("max_gt").value == "big" and wp.field("mean_gt").value == "0.5"  # not lost
        for name in ("abs_mean_gt", "max_gt", "min_gt"):  # below its field, at the form's full width
            field = wp.fields[name]
            assert field.widget.children[1] is field.error and field.error.layout.width == "100%"
        # nothing given: one message for the form, in the form's words
        for name in ("abs_mean_gt", "max_gt", "min_gt", "mean_gt"):
            wp.field(name).value = ""
        wp.create.click()
        assert set(wp.errors()) == {"form"} and "choose from Average of the absolute value >, max >" in \
            wp.errors()["form"], wp.errors()
        # a rule about fields together lands under the fields it names
        wp.condition.value = "TR"
        wp.field("range_percentage_gt").value = "50"
        wp.create.click()
        assert {"range_start_inclusive", "range_end_inclusive"} <= set(wp.errors()), wp.errors()
        wp.field("range_start_inclusive").value = "0"
        wp.field("range_end_inclusive").value = "1"
        assert wp.submit() is not None and wp.errors() == {} and not wp.form_open
        assert panel.errors == []
    finally:
        panel.close()
        dbg.close()


def _quickstart_model():
    class Regressor(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(8, 32)
            self.fc2 = nn.Linear(32, 1)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x))) * torch.log(x[:, :1])

    torch.manual_seed(0)
    model = Regressor()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def train():
        g = torch.Generator().manual_seed(1)
        for step in range(8):
            x = torch.rand(16, 8, generator=g) + 0.5
            if step == 3:
                x[5, 0] = -1.0
            opt.zero_grad()
            nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True)).backward()
            opt.step()
    return model, train


def test_one_step_convention_and_hit_counts_agree():
    """Paused at the step boundary after the hits of step 3: header, pause reason, hit rows and the
    status item all say step 3 and count the same hits; notices are apart and not counted."""
    model, train = _quickstart_model()
    dbg = nbdebug.Debugger(model, level="mix")
    panel = Panel(dbg, recommend=False)
    try:
        dbg.watch("TO")
        dbg.watch("WCL", abs_mean_update_ratio_gt=1e9)  # change condition: no notice on the first step
        dbg.run(train, paused=True)
        panel.controls.cont.click()
        assert dbg.wait(60) is State.PAUSED
        panel.flush()
        assert "in step 3" in dbg.pause_reason and dbg.step_index == 4
        h = panel.header
        assert h.step.value == "3" and "step 4 next" in h.step_running.value
        n_hits = sum(1 for r in dbg.hits if r.hits)
        assert n_hits > 1
        assert h.hit_count.value == str(n_hits)
        assert panel.hit_list.title.value == f"<b>Hits</b> ({n_hits})"
        assert status(dbg)["hits"] == n_hits
        # grouped by node and condition, in execution order, first the log; paged: over all pages every hit
        # is counted in its group's title, and at most ROWS_PER_GROUP of a group's records are rows
        hl = panel.hit_list
        groups, counts, rows = [], [], 0
        for page in range(hl.pages):
            hl.page_to(page)
            assert len(hl.groups()) <= PAGE_GROUPS
            for g in hl.groups():
                groups.append(g.children[0].value)
                counts.append(int(re.search(r"· (\d+) hits?", g.children[0].value).group(1)))
                rows += len(g.children) - 1
                assert len(g.children) - 1 == min(counts[-1], ROWS_PER_GROUP)
        hl.page_to(0)
        assert all("step 3" in t for t in groups)
        assert "Torch.log.0.forward" in groups[0] and len(set(groups)) == len(groups)
        assert sum(counts) == n_hits and rows <= n_hits
        # no notice at all for WCL on step 0, and none counted as a hit
        assert not [r for r in dbg.hits if r.condition == "WCL" and r.step == 0]
        notices = [r for r in dbg.hits if not r.hits]
        assert len(panel.hit_list.notice_rows()) == len(notices)
        assert (panel.hit_list.notice_box.layout.display == "none") == (not notices)
        assert panel.errors == []
    finally:
        dbg.terminate()
        dbg.wait(10)
        panel.close()
        dbg.close()


def test_notices_are_apart_from_hits():
    """Values not kept (memory budget 0): a WNC watchpoint can only say it could not check."""
    torch.manual_seed(0)
    model = Net()
    dbg = nbdebug.Debugger(model, level="L0", memory_budget=0)
    try:
        train_steps(model, 2)
        dbg.watch("WNC")
        dbg.watch("TL", max_gt=-1e9)  # fires everywhere
        dbg.recheck()
        panel = Panel(dbg, recommend=False)
        hits = [r for r in dbg.hits if r.hits]
        notices = [r for r in dbg.hits if not r.hits]
        assert hits and notices
        assert panel.hit_list.title.value == f"<b>Hits</b> ({len(hits)})"
        assert panel.header.hit_count.value == str(len(hits))
        first_page = group_hits(hits)[:PAGE_GROUPS]  # the hit list is paged by node and condition
        assert len(panel.hit_list.rows()) == sum(min(len(rs), ROWS_PER_GROUP) for _k, rs in first_page)
        assert len(panel.hit_list.notice_rows()) == len(notices)
        assert f"Could not check</b> ({len(notices)})" in panel.hit_list.notice_title.value
        assert panel.hit_list.notice_box.layout.display == "flex"
        panel.close()
    finally:
        dbg.close()


def test_closed_debugger_panel_says_closed_and_offers_no_control():
    torch.manual_seed(0)
    model = Net()
    dbg = nbdebug.Debugger(model, level="L0")
    panel = Panel(dbg, recommend=False)
    dbg.run(train_steps.__wrapped__ if hasattr(train_steps, "__wrapped__") else (lambda: train_steps(model, 1)),
            paused=True)
    panel.flush()
    assert _enabled(panel)["continue"]
    dbg.close()  # terminates the paused training and detaches
    panel.poll()  # what the kernel's poll does every second
    panel.flush()
    assert "data-state='closed'" in panel.header.state.value
    assert "closed" in panel.header.reason.value and "closed" in panel.controls.status.value
    assert not any(_enabled(panel).values())
    assert panel.errors == []
    panel.close()


def test_failure_is_in_the_header_with_the_node_that_ran_last():
    torch.manual_seed(0)
    model = Net()
    dbg = nbdebug.Debugger(model, level="mix")
    panel = Panel(dbg, recommend=False)
    try:
        def boom():
            h = model.fc1(torch.randn(2, 8))
            raise ValueError(f"shape mismatch after {tuple(h.shape)}")

        dbg.run(boom, block=True)  # in the foreground
        panel.flush()
        assert dbg.state is State.FAILED
        fail = panel.header.failure.value
        assert "ValueError: shape mismatch after (2, 16)" in fail and "in step 0" in fail
        assert "Module.fc1" in fail  # the module that ran last
        assert "Module.fc1" in panel.controls.status.value
        assert panel.selected is not None and panel.selected in fail  # selected: graph and details show it
        assert panel.selected in panel.details.title.value and panel.errors == []
        assert not any(_enabled(panel).values())
    finally:
        panel.close()
        dbg.close()


def _two_step_dump(root: Path) -> None:
    def tensor(mx, mn, mean, norm):
        return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": mx, "Min": mn,
                "Mean": mean, "Norm": norm}

    for step, out in ((0, tensor(1.0, 0.0, 0.5, 1.0)), (1, tensor(3.0, 2.0, 2.5, 3.6))):
        d = root / f"step{step}" / "rank0"
        d.mkdir(parents=True)
        entry = {"input_args": [tensor(1.0, -1.0, 0.0, 1.4142135)], "input_kwargs": {}, "output": [out]}
        (d / "dump.json").write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch",
                                                 "dump_data_dir": None,
                                                 "data": {"Functional.relu.0.forward": entry}}))


def test_offline_step_selector_switches_every_view(tmp_path):
    _two_step_dump(tmp_path)
    off = nbdebug.load(str(tmp_path))
    panel = off.panel()
    node = "Functional.relu.0.forward"
    try:
        h = panel.header
        assert h.pid.value == "" or h.pid.layout is not None
        assert str(tmp_path) in h.dump.value and "steps 0, 1" in h.dump.value
        assert os.getpid() != 0 and str(os.getpid()) not in h.widget.children[2].children[1].value
        sel = panel.step_select
        assert [v for _t, v in sel.options] == [0, 1] and sel.value == 1 and h.step.value == "1"
        panel.select(node)
        panel.view(node, "output.0")
        assert "2.5" in panel.details.table.value and "2.5" in panel.tensor_view.stats.value  # step 1's mean
        panel.watch.add.click()
        panel.watch.condition.value = "TL"
        panel.watch.field("max_gt").value = "2"
        assert panel.watch.submit() is not None
        sel.value = 0  # the dropdown: every view follows
        assert off.current_step == 0 and h.step.value == "0"
        assert off.stats(node, "output.0")["max"] == 1.0
        assert "2.5" not in panel.details.table.value and "0.5" in panel.details.table.value
        assert "0.5" in panel.tensor_view.stats.value
        assert panel.errors == []
    finally:
        panel.close()


def test_quickstart_used_through_its_panel_then_run_on(tmp_path, monkeypatch):
    """The quickstart's own cells after the panel was used as its text says (TO in the form, CONTINUE
    into the hit, View) — they used to raise KeyError (continued past the hit, then read step 4)."""
    nb = nbformat.read(REPO / "notebooks" / "quickstart.ipynb", as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip() == "dbg")
    use_panel = f"""\
assert nbdebug.__file__.startswith({str(REPO)!r}), nbdebug.__file__
p = dbg.panel()
p.watch.add.click()
p.watch.condition.value = "TO"
assert p.watch.submit() is not None
p.controls.cont.click()
import time
t0 = time.monotonic()
while not dbg.hits and time.monotonic() - t0 < 60:
    time.sleep(0.05)
dbg.wait(60)
p.refresh()  # the training thread's events reach the panel on the kernel's loop, busy with this cell
assert dbg.state == "paused" and p.header.step.value == "3", (dbg.state, p.header.step.value)
p.hit_list.rows()[0].children[1].click()   # View
assert p.errors == []"""
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(use_panel))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "negative inputs to log: 1 at rows [5]" in text


def test_foreground_failure_in_a_cell_reaches_the_header():
    """A plain training loop in a cell (no dbg.run) raises inside a step: the post_run_cell hook puts
    the exception and the node that ran last in the header; the next training activity clears it."""
    from types import SimpleNamespace

    from nbdebug.ui.panel import after_cell

    torch.manual_seed(0)
    model = Net()
    dbg = nbdebug.Debugger(model, level="mix")
    panel = Panel(dbg, recommend=False)
    try:
        train_steps(model, 1)
        try:
            model.fc1(torch.randn(2, 8))
            raise RuntimeError("CUDA out of memory (pretend)")
        except RuntimeError as e:
            after_cell(SimpleNamespace(error_in_exec=e))
        fail = panel.header.failure.value
        assert "RuntimeError: CUDA out of memory (pretend)" in fail and "in step 1" in fail
        assert "Module.fc1" in fail and panel.selected is not None and panel.selected in fail
        after_cell(SimpleNamespace(error_in_exec=None))  # a later cell that ran fine: still shown
        panel.refresh()
        assert "CUDA out of memory" in panel.header.failure.value
        train_steps(model, 1)  # training went on: the failure is history
        panel.refresh()
        assert panel.header.failure.value == "" and panel.errors == []
    finally:
        panel.close()
        dbg.close()


def test_foreground_failure_hook_in_a_real_kernel(tmp_path, monkeypatch):
    cells = [f"""\
import nbdebug, torch
assert nbdebug.__file__.startswith({str(REPO)!r})
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
dbg = nbdebug.Debugger(model, level="mix")
p = dbg.panel()""",
             """\
for step in range(2):
    loss = model(torch.randn(2, 4)).sum()
    if step == 1:
        raise ValueError("bad batch")
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()""",
             """\
p.refresh()
print("FAILURE:", p.header.failure.value)"""]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert [o.ename for o in nb.cells[1].outputs if o.output_type == "error"] == ["ValueError"]
    assert not [o for c in (nb.cells[0], nb.cells[2]) for o in c.outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in nb.cells[2].outputs)
    assert "ValueError: bad batch" in text and "in step 1" in text and "at Tensor.sum.0.forward" in text, text
