"""The compare panel at widget level: colours, filtering, sorting, paging, clicking a row (both tensors
and their difference, the node selected in both graphs), the first-divergence button."""

import json
import os

import numpy as np
import pytest

import nbdebug
from nbdebug.ui.compare_panel import COLOURS, ComparePanel


def _dump(root, values, framework="pytorch"):
    """A tensor dump of a chain of ops; ``values`` is a list of (name, [input arrays], [output arrays])."""
    d = os.path.join(root, "step0", "rank0")
    data_dir = os.path.join(d, "dump_tensor_data")
    os.makedirs(data_dir)
    data = {}
    for name, ins, outs in values:
        entry = {"input_args": [], "input_kwargs": {}, "output": []}
        for key, prefix, arrs in (("input_args", "input", ins), ("output", "output", outs)):
            for i, a in enumerate(arrs):
                fname = f"{name}.{prefix}.{i}.npy"
                np.save(os.path.join(data_dir, fname), a)
                entry[key].append({"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(a.shape),
                                   "Max": float(a.max()), "Min": float(a.min()), "Mean": float(a.mean()),
                                   "Norm": float(np.linalg.norm(a)), "data_name": fname})
        data[name] = entry
    with open(os.path.join(d, "dump.json"), "w") as f:
        json.dump({"task": "tensor", "level": "L1", "framework": framework, "dump_data_dir": data_dir,
                   "data": data}, f)
    return str(root)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    h = np.maximum(x, 0)
    y = (h * 2).astype(np.float32)
    golden = [("Functional.relu.0.forward", [x], [h]), ("Tensor.mul.0.forward", [h], [y]),
              ("Functional.tanh.0.forward", [y], [np.tanh(y)])]
    h_bad = h.copy()
    h_bad[0, :] += 0.5  # relu differs in the target
    y_bad = (h_bad * 2).astype(np.float32)
    target = [("Functional.relu.0.forward", [x], [h_bad]), ("Tensor.mul.0.forward", [h_bad], [y_bad]),
              ("Functional.gelu.0.forward", [y_bad], [y_bad])]
    t = _dump(tmp_path_factory.mktemp("target"), target)
    g = _dump(tmp_path_factory.mktemp("golden"), golden)
    return nbdebug.compare(t, g)


def test_rows_are_coloured_by_status(result):
    p = ComparePanel(result, graphs=False)
    assert len(p.row_buttons) == len(result.rows)
    for box, btn, row in zip(p.row_boxes, p.row_buttons, p.visible_rows(), strict=True):
        assert btn.style.button_color == COLOURS[row.status]
        assert btn.tooltip.startswith(f"{row.name}: ")  # the whole name, however narrow the button
        assert f"nbdebug-compare-{row.status}" in box._dom_classes
    statuses = {r.status for r in result.rows}
    assert {"pass", "unmatched"} <= statuses and statuses & {"error", "warning"}
    assert "first divergence: Functional.relu.0.forward" in p.first_button.description


def test_filter_sort_and_pages(result):
    p = ComparePanel(result, page_size=2, graphs=False)
    assert p.page_label.value == f"rows 1–2 of {len(result.rows)}" and p.prev_button.disabled
    p.next_button.click()
    assert p.page == 1 and [b.description for b in p.row_buttons] == [r.name for r in result.rows[2:4]]
    p.filter_status.value = "unmatched"  # as a click on the toggle does
    assert {r.status for r in p.visible_rows()} == {"unmatched"} and p.page == 0
    p.filter_status.value = "all"
    p.filter_text.value = "mul"
    assert [r.name for r in p.visible_rows()] == ["Tensor.mul.0.forward.input.0", "Tensor.mul.0.forward.output.0"]
    p.set_filter(text="")
    p.sort_menu.value = "MaxAbsErr"
    p.desc_box.value = True
    vals = [r.max_abs_err for r in p.visible_rows()]
    known = [v for v in vals if not np.isnan(v)]
    assert known == sorted(known, reverse=True) and all(np.isnan(v) for v in vals[len(known):])
    with pytest.raises(ValueError, match="sort by"):
        p.sort("color")


def test_clicking_a_row_shows_both_tensors_and_selects_both_graphs(result):
    p = ComparePanel(result)
    assert p.graph_target is not None and p.graph_golden is not None
    idx = [r.name for r in p.visible_rows()].index("Functional.relu.0.forward.output.0")
    p.row_buttons[idx].click()
    assert p.selected.name == "Functional.relu.0.forward.output.0"
    assert "nbdebug-compare-selected" in p.row_boxes[idx]._dom_classes
    assert list(p.tensor_shown) == ["target", "golden", "diff"]
    assert [p.tensor_views[k].layout.display for k in ("target", "golden", "diff")] == ["block"] * 3
    a = result.target.tensor("Functional.relu.0.forward", "output.0", 0)
    b = result.golden.tensor("Functional.relu.0.forward", "output.0", 0)
    diff = np.asarray(a - b, dtype=np.float64)
    np.testing.assert_allclose(p.tensor_shown["diff"], diff.reshape(p.tensor_shown["diff"].shape), atol=1e-6)
    (diff_msg,) = p.tensor_views["diff"].recorded()
    assert diff_msg["scale"] == "diverging" and diff_msg["step"].startswith("difference target step 0")
    assert p.tensor_views["diff"].recorded_buffers("heatmap") == [p.tensor_shown["diff"].tobytes()]
    assert "Functional.relu.0.forward.output.0" in p.detail.value and f"({p.selected.status}," in p.detail.value
    assert p.selected.status in ("error", "warning")
    assert p.graph_target.selected == "Functional.relu.0.forward"
    assert p.graph_golden.selected == "Functional.relu.0.forward"
    # an unmatched target row: no golden tensor, the golden graph has nothing selected
    gi = [r.name for r in p.visible_rows()].index("Functional.gelu.0.forward.output.0")
    p.row_buttons[gi].click()
    assert list(p.tensor_shown) == ["target"] and p.tensor_views["golden"].layout.display == "none"
    assert p.graph_target.selected == "Functional.gelu.0.forward" and p.graph_golden.selected is None


def test_compare_panel_has_no_plotly_figure(result):
    from nbdebug.ui.frontend import FrontendWidget

    p = ComparePanel(result, graphs=False)
    p.select(0)
    stack, found = [p.widget], []
    while stack:
        wd = stack.pop()
        found.append(wd)
        stack.extend(getattr(wd, "children", ()))
    assert not [wd for wd in found if type(wd).__module__.split(".")[0] == "plotly"]  # no plotly widget
    assert sum(isinstance(wd, FrontendWidget) and wd.view == "heatmap" for wd in found) == 3


def test_first_divergence_button(result):
    p = ComparePanel(result, page_size=1, graphs=False)
    p.first_button.click()
    assert p.selected.target == "Functional.relu.0.forward" and p.selected.slot == "output.0"
    assert p.row_buttons[0].description == "Functional.relu.0.forward.output.0"  # paged to it


def test_result_panel_and_statistics_only_rows(tmp_path):
    d = os.path.join(tmp_path, "step0", "rank0")
    os.makedirs(d)
    t = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [3], "Max": 1.0, "Min": 0.0, "Mean": 0.5,
         "Norm": 1.2}
    with open(os.path.join(d, "dump.json"), "w") as f:
        json.dump({"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
                   "data": {"Functional.relu.0.forward": {"input_args": [t], "input_kwargs": {}, "output": [t]}}}, f)
    res = nbdebug.compare(str(tmp_path), str(tmp_path))
    p = res.panel()
    assert isinstance(p, ComparePanel)
    p.select(0)
    assert p.tensor_shown == {} and "statistics only" in p.tensor_message.value
    assert "<table>" in p.detail.value and "nbdebug-compare" in p.widget._dom_classes
