"""The tensor view on nbdebug's front end (kernel side): the heatmap and relations messages, and
statistics that agree between node details and the tensor view (issue 10)."""

import base64

import numpy as np
import pytest
import torch
import torch.nn as nn

import nbdebug
from nbdebug.ui.frontend import FrontendWidget
from nbdebug.ui.heatmap_data import MAX_HEAT, heatmap_message
from nbdebug.ui.panel import Panel
from nbdebug.ui.tensor_math import node_stats, stat_texts

LOG = "Torch.log.0.forward"
SHOWN_IN_DETAILS = ("max", "min", "mean", "count", "nan_count", "neg_inf_count", "pos_inf_count", "zero_count")


def step_inputs():
    """Three steps' inputs of ``log``: zeros (−Inf), negatives (NaN) and a large finite value."""
    base = torch.linspace(0.05, 0.95, 12).reshape(3, 4)
    out = []
    for k in range(3):
        x = base + 0.1 * k
        x[0, 1] = -1.0      # NaN
        x[1, 2] = 0.0       # −Inf
        x[2, k] = 1.475     # log = 0.388658…: a finite maximum the NaN must not hide
        out.append(x)
    return out


class Log(nn.Module):
    def forward(self, x):
        return torch.log(x)


@pytest.fixture
def debugged():
    model = Log()
    dbg = nbdebug.Debugger(model, level="mix")
    for x in step_inputs():
        model(x)
        dbg.step()
    model(step_inputs()[0] * 2)  # step 3 in progress
    panel = Panel(dbg, recommend=False)
    yield dbg, panel
    panel.close()
    dbg.close()


# -- the heatmap message ----------------------------------------------------------------------------------
def test_slices_keep_their_original_indices():
    x = np.arange(10 * 6 * 3, dtype=np.float32).reshape(10, 6, 3)
    msg, plane = heatmap_message(x, ["4:8", ":", "2"], title="t", step="current step 3")
    assert msg["rows"] == [4, 5, 6, 7] and msg["cols"] == [0, 1, 2, 3, 4, 5]
    assert (msg["row_axis"], msg["col_axis"], msg["index"]) == (0, 1, [None, None, 2])
    np.testing.assert_array_equal(plane, x[4:8, :, 2])
    msg, plane = heatmap_message(x, ["1", "1::2", "-1"], title="t", step="s")
    assert msg["rows"] is None and msg["cols"] == [1, 3, 5] and msg["index"] == [1, None, 2]
    assert msg["shape"] == [1, 3]  # 1-D: one row
    np.testing.assert_array_equal(plane, x[1, 1::2, -1][None, :])


def test_nan_and_infinities_are_counted_and_sent_bit_for_bit():
    x = np.array([[0.5, np.nan, -np.inf], [np.inf, -0.25, np.nan]], dtype=np.float32)
    msg, plane = heatmap_message(x, [":", ":"], title="t", step="s")
    assert msg["counts"] == {"nan": 2, "pos_inf": 1, "neg_inf": 1}
    assert (msg["vmin"], msg["vmax"]) == (-0.25, 0.5)  # the finite range
    back = np.frombuffer(memoryview(plane).tobytes(), dtype=msg["dtype"]).reshape(msg["shape"])
    np.testing.assert_array_equal(back, x)  # NaN at the same places, ±Inf kept
    # integers beyond float32's exact range go as float64
    big = np.array([[2**40 + 1]], dtype=np.int64)
    msg, plane = heatmap_message(big, [":", ":"], title="t", step="s")
    assert msg["dtype"] == "float64" and plane[0, 0] == 2**40 + 1


def test_signed_data_gets_a_scale_centred_on_zero():
    assert heatmap_message(np.array([[-1.0, 3.0]]), [":", ":"], title="t", step="s")[0]["scale"] == "diverging"
    assert heatmap_message(np.array([[0.0, 3.0]]), [":", ":"], title="t", step="s")[0]["scale"] == "sequential"
    forced = heatmap_message(np.array([[0.0, 3.0]]), [":", ":"], title="t", step="s", diverging=True)[0]
    assert forced["scale"] == "diverging"


def test_large_selections_are_cut_to_max_heat_and_the_title_says_so():
    x = np.zeros((MAX_HEAT + 8, 3), dtype=np.float32)
    msg, plane = heatmap_message(x, [":", ":"], title="big", step="s")
    assert plane.shape == (MAX_HEAT, 3) and msg["rows"] == list(range(MAX_HEAT))
    assert f"of {MAX_HEAT + 8}×3" in msg["title"] and msg["note"]


# -- the tensor view ----------------------------------------------------------------------------------------
def test_tensor_view_titles_steps_and_uses_no_plotly(debugged):
    dbg, panel = debugged
    tv = panel.tensor_view
    tv.open(LOG, "output.0")
    assert tv.message["step"] == "current step 3" and tv.message["reveal"] is True
    assert "current step 3" in tv.title.value
    assert tv.message["counts"] == {"nan": 1, "pos_inf": 0, "neg_inf": 1}
    tv.set_selection(["1:3", ":"])
    assert tv.message["rows"] == [1, 2] and tv.message["reveal"] is False  # only a new tensor scrolls
    tv.mode.value = "previous"
    assert tv.message["step"] == "previous step 2"
    np.testing.assert_array_equal(tv.shown, dbg.tensor(LOG, "output.0", 2)[1:3])
    tv.mode.value = "compare"
    assert tv.message["step"] == "difference step 3 − step 2" and tv.message["scale"] == "diverging"
    tv.open(LOG, "output.0", step=2)
    assert tv.message["step"] == "current step 2"
    tv.mode.value = "previous"
    assert tv.message["step"] == "previous step 1"
    tree, stack = [], [tv.widget]
    while stack:
        wd = stack.pop()
        tree.append(wd)
        stack.extend(getattr(wd, "children", ()))
    assert not [wd for wd in tree if type(wd).__module__.split(".")[0] == "plotly"]  # no plotly widget
    assert {wd.view for wd in tree if isinstance(wd, FrontendWidget)} == {"heatmap", "relations"}


def test_details_and_tensor_view_show_the_same_statistics(debugged):
    dbg, panel = debugged
    recorded = dbg.stats(LOG, "output.0")
    assert np.isnan(recorded["max"])  # the recorder's max includes the NaN: the old details showed "nan"
    panel.select(LOG)
    panel.tensor_view.open(LOG, "output.0")
    in_details = panel.details.stat_texts("output.0")
    in_view = panel.tensor_view.stat_texts("current")
    assert in_details == {k: in_view[k] for k in SHOWN_IN_DETAILS}
    values = dbg.tensor(LOG, "output.0")
    finite = values[np.isfinite(values)]
    assert in_view["max"] == f"{finite.max():.6g}" and in_view["min"] == f"{finite.min():.6g}"
    assert (in_view["nan_count"], in_view["neg_inf_count"], in_view["pos_inf_count"]) == ("1", "1", "0")
    assert f"<td>{in_view['max']}</td>" in panel.details.table.value
    assert f"<td>{in_view['max']}</td>" in panel.tensor_view.stats.value


def test_a_step_whose_values_are_gone_shows_why_not_a_later_value(debugged):
    dbg, panel = debugged
    tv = panel.tensor_view
    tv.open(LOG, "output.0", step=0)
    reason = tv.error_texts["current"]
    assert "no retained value" in reason
    assert tv.shown is None and tv.message["empty"] == reason
    st = tv.stat_columns["current"]
    assert st["basis"] == "recorded" and st["note"] == reason
    texts = tv.stat_texts("current")
    assert texts["max"] == "n/a" and texts["nan_count"] == "1"  # finite max unknown, counts recorded
    assert reason in tv.stats.value
    # the shared function gives the same answer
    assert stat_texts(node_stats(panel.details.source, LOG, "output.0", 0)) == texts


def test_relations_message_and_click(debugged):
    dbg, panel = debugged
    tv = panel.tensor_view
    tv.open(LOG, "output.0")
    (msg,) = [m for m in tv.relations.recorded() if m["type"] == "relations"]
    names = [n[0] for n in msg["nodes"]]
    assert msg["center"] == LOG and {-1, 0} <= {n[3] for n in msg["nodes"]} <= {-1, 0, 1}
    assert LOG in names and names == tv._rel_names
    for k in range(0, len(msg["edges"]), 2):
        a, b = msg["edges"][k], msg["edges"][k + 1]
        assert names[b] in dbg.graph.successors(names[a])
    up = next(n for n in names if n != LOG)
    tv.relations.receive({"type": "click", "name": up})
    assert panel.selected == up


def test_snapshot_replays_the_heatmap_with_its_buffer(debugged):
    dbg, panel = debugged
    tv = panel.tensor_view
    tv.open(LOG, "output.0")
    snap = tv.heatmap.snapshot()
    (heat,) = [m for m in snap["messages"] if m["type"] == "heatmap"]
    (b64,) = heat["buffers_b64"]
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(b64), np.float32).reshape(heat["shape"]), tv.shown)
    sent = []
    tv.heatmap.post = lambda content, buffers=None, record=True: sent.append((content, buffers, record))
    tv.heatmap.receive({"type": "hello"})  # a view that renders later asks again
    (content, buffers, record), = [s for s in sent if s[0]["type"] == "heatmap"]
    assert record is False and bytes(buffers[0]) == tv.shown.tobytes()
