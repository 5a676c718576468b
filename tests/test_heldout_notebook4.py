"""Held-out trials of daily notebook workflows (round 4): interrupting training, re-running cells, two
debuggers, a long run's timeline — in the kernel and, where the panel is involved, in real JupyterLab /
Notebook 7 through Chromium (tests/browser.py).

Defects they showed, each tested here:

- the kernel's Interrupt (``KeyboardInterrupt``) in a training loop's *backward pass or optimizer step*: the
  step was left open (autograd skips its final callbacks, the optimizer its post-hook), so the next cell's
  first iteration was recorded into it — the step showed the module called twice (``forward.0`` and
  ``forward.1``) with the interrupted iteration's and the next one's tensors mixed. An interrupted forward
  already closed its step on its own; now an interrupted backward or optimizer step does too (the next
  outermost module call finds the backward pass unfinished, or the optimizer's step no longer on the stack).
  A forward run inside them (a checkpoint's recomputation, LBFGS's closure) still belongs to the step.
  An Interrupt landing where nothing tells the iteration from a gradient-accumulation one (after the backward
  pass returned, before ``opt.step()`` — where a long backward's Interrupt lands; or in a hook of the user's
  before nbdebug recorded any of the backward) is handled at the cell's end: a shown panel's ``post_run_cell``
  hook closes the step the cell left (``Debugger.end_abandoned_step``);
- the header said "failed in step N at …: KeyboardInterrupt" for the user's own Interrupt: it reads
  "interrupted in step N at NODE (KeyboardInterrupt)";
- the control line of a panel over a plain training loop kept "3 steps recorded" (its redraw was keyed on the
  state only) while the header went on to step 5 when the training cell was run again;
- ``dbg`` and ``dbg.panel()`` in two cells: a click on the first panel's timeline scrubbed the session, but the
  second panel kept its header and timeline marker at the latest step while its views read the scrubbed one;
- plotly's mode bar covered the timeline heatmap's first row at the latest steps: a click meant to scrub to a
  recent step zoomed the chart (the figure has a top margin for the bar now);
- an Interrupt landing inside ``Coalescer.mark`` (a foreground loop marks on every step) left a redraw promised
  and never scheduled: that view (the timeline) never redrew again.

What held, in JupyterLab and Notebook 7: the ``Debugger`` cell run twice is refused with "call close() on it
first" and the first debugger stays attached, usable and shown (a decision: no silent replace); two panels of
one debugger follow the training cell run again; a second debugger's ``close()`` turns only its panel to
"closed"; "Restart kernel and run all" leaves live, agreeing panels and no stale banner.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils import checkpoint as cp

import nbdebug


class _Interrupt(torch.autograd.Function):
    """Raises ``KeyboardInterrupt`` in its backward when ``on`` (what Ctrl-C / the kernel's Interrupt raises
    between two bytecodes of a backward hook)."""

    on = False

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        if _Interrupt.on:
            raise KeyboardInterrupt
        return g


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 1)

    def forward(self, x):
        return self.b(_Interrupt.apply(self.a(x).relu()))


@pytest.mark.parametrize("where", ["backward", "optimizer"])
@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_an_interrupted_backward_or_optimizer_step_stands_alone(level: str, where: str) -> None:
    torch.manual_seed(0)
    model = _Net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    interrupt_opt = [False]

    def pre(_opt, _args, _kwargs):  # runs inside optimizer.step(), after nbdebug's own pre-hook
        if interrupt_opt[0]:
            raise KeyboardInterrupt

    opt.register_step_pre_hook(pre)

    def train(n: int) -> None:
        for _ in range(n):
            opt.zero_grad()
            model(torch.randn(3, 4)).pow(2).mean().backward()
            opt.step()

    with nbdebug.Debugger(model, level=level) as dbg:
        train(2)
        _Interrupt.on, interrupt_opt[0] = where == "backward", where == "optimizer"
        try:
            with pytest.raises(KeyboardInterrupt):
                train(1)  # the cell interrupted
        finally:
            _Interrupt.on = interrupt_opt[0] = False
        assert dbg.step_index == 2
        train(3)  # the next cell continues training
        assert dbg.step_index == 6, "the interrupted step is one step, the three after it three more"
        whole = set(dbg.session.steps[1].keys)
        for step in (3, 4, 5):
            keys = dbg.session.steps[step].keys
            assert set(keys) == whole and len(keys) == len(whole), (step, sorted(set(keys) ^ whole)[:4])
        partial = set(dbg.session.steps[2].keys)
        assert partial < whole, sorted(partial - whole)[:4]  # nothing of the next iteration in it


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_checkpoints_recomputation_and_an_lbfgs_closure_stay_in_their_step(reentrant: bool) -> None:
    """The forward a checkpoint recomputes inside the backward pass, and the forward LBFGS's closure runs
    inside ``optimizer.step()``, are no interrupted step: one step per iteration, all alike."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=2)

    def closure():
        opt.zero_grad()
        h = cp.checkpoint(model[:2], torch.randn(3, 4, requires_grad=reentrant), use_reentrant=reentrant)
        loss = model[2](h).pow(2).mean()
        loss.backward()
        return loss

    with nbdebug.Debugger(model, level="L0") as dbg:
        for _ in range(3):
            opt.step(closure)
        assert dbg.step_index == 3
        sizes = collections.Counter(len(dbg.session.steps[i].keys) for i in range(3))
        assert len(sizes) == 1, sizes


def _plain_training():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def train(n: int) -> None:
        for _ in range(n):
            opt.zero_grad()
            model(torch.randn(2, 4)).pow(2).mean().backward()
            opt.step()

    return model, train


def test_the_control_line_counts_the_steps_of_a_training_cell_run_again() -> None:
    """The training cell (a plain loop, outside ``dbg.run``) run again after the panel is shown: the control
    line said "3 steps recorded" for ever (its redraw was keyed on the state only), beside a header at step 5."""
    model, train = _plain_training()
    with nbdebug.Debugger(model) as dbg:
        train(3)
        panel = dbg.panel()
        panel.flush()
        assert "3 steps recorded" in panel.controls.status.value, panel.controls.status.value
        train(2)
        panel.flush()
        assert "5 steps recorded" in panel.controls.status.value, panel.controls.status.value
        assert "4" in panel.header.step.value, panel.header.step.value
        panel.close()


def test_an_interrupted_training_cell_reads_interrupted_not_failed() -> None:
    """The kernel's Interrupt in a plain training loop: the panel's header said "failed in step N at …:
    KeyboardInterrupt" — the user stopped it; it reads "interrupted in step N at …" now, and training the
    next cell clears it."""
    from nbdebug.ui.panel import after_cell

    model, train = _plain_training()
    with nbdebug.Debugger(model) as dbg:
        train(2)
        panel = dbg.panel()
        panel.flush()
        stop = model[2].register_forward_hook(lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        try:
            train(1)
        except KeyboardInterrupt as e:
            after_cell(type("Result", (), {"error_in_exec": e})())  # IPython's post_run_cell
        finally:
            stop.remove()
        panel.flush()
        text = panel.header.failure.value
        assert "interrupted in step 2 at Module.2.Linear.forward.0 (KeyboardInterrupt)" in text, text
        assert "failed" not in text, text
        train(1)
        panel.flush()
        assert "interrupted" not in panel.header.failure.value, panel.header.failure.value
        panel.close()


def test_a_step_scrubbed_in_one_panel_shows_in_the_other_panel_of_the_debugger() -> None:
    """``dbg`` shown in one cell and ``dbg.panel()`` in a later one: a click on the first panel's timeline makes
    the session show another step, which every view of *both* panels reads; the second panel kept its header
    (and its timeline's marker) at the latest step while its node details read the scrubbed one."""
    model, train = _plain_training()
    with nbdebug.Debugger(model) as dbg:
        train(12)
        first, second = dbg.panel(), dbg.panel()
        second.timeline.show(True)
        for p in (first, second):
            p.poll()
            p.flush()
        assert "11" in second.header.step.value
        assert first.scrub(9) is None
        first.flush()
        second.poll()  # what its 1 s poll does in a kernel
        second.flush()
        assert ">9<" in second.header.step.value or second.header.step.value.strip().endswith("9"), \
            second.header.step.value
        assert second.timeline.timeline.step == 9
        first.timeline.release()  # "latest step" in the first panel: both again at the latest
        second.poll()
        second.flush()
        assert "11" in second.header.step.value and second.timeline.timeline.step == 11
        first.close()
        second.close()


# -- in the browser ---------------------------------------------------------------------------------------

SETUP = """\
import time, torch, nbdebug
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
model2 = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1))
opt2 = torch.optim.SGD(model2.parameters(), lr=0.01)
slow = [0.0]  # seconds each backward pass takes (an Interrupt then lands in the backward pass)

def in_backward(g):  # says so in a file, then takes its time: the test presses Interrupt once the file is there
    open("in_backward", "w").close()
    time.sleep(slow[0])

def train(n, m=model, o=opt):
    for _ in range(n):
        o.zero_grad()
        out = m(torch.randn(2, m[0].in_features))
        if slow[0]:
            out.register_hook(in_backward)
        out.pow(2).mean().backward()
        o.step()"""
CHECK = """\
s = dbg.session
whole = set(s.steps[s.step_index - 1].keys)
clean = all(set(s.steps[i].keys) == whole and len(s.steps[i].keys) == len(whole)
            for i in range(s.step_index - 3, s.step_index))
print('KERNEL', dbg.step_index, 'clean' if clean else 'MIXED', s.chosen_step)"""


def _nb_facts(lab: Any) -> list[dict[str, Any]]:
    return lab.page.evaluate("""(sel) => Array.from(document.querySelectorAll(sel)).map(p => {
        const st = p.querySelector('.nbdebug-state [data-state]');
        const t = c => { const e = p.querySelector(c); return e ? e.textContent.trim() : ''; };
        return {state: st ? st.dataset.state : null, step: t('.nbdebug-step'), failure: t('.nbdebug-failure'),
                control: t('.nbdebug-control-status'), error: t('.nbdebug-panel-error'),
                timeline: t('.nbdebug-timeline-title')};
    })""", _PANEL)


_PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden) .nbdebug-panel"


def _until(lab: Any, what: str, check: Any, timeout: float = 60.0) -> list[dict[str, Any]]:
    """Poll the panels' facts until ``check(facts)``; fail saying what was awaited and what they show."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        facts = _nb_facts(lab)
        if check(facts):
            return facts
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not seen in {timeout:.0f} s; panels: {facts}; errors: {lab.errors[-5:]}")
        time.sleep(0.3)


def _output(lab: Any, index: int) -> str:
    return lab.page.evaluate("""(i) => window.jupyterapp.shell.currentWidget.content.widgets[i]
        .node.querySelector('.jp-OutputArea')?.textContent ?? ''""", index)


def _run_nowait(lab: Any, index: int) -> None:
    lab.page.evaluate("""(i) => { const p = window.jupyterapp.shell.currentWidget; p.content.activeCellIndex = i;
        p.content.deselectAll(); void window.jupyterapp.commands.execute('notebook:run-cell'); }""", index)


def _interrupt_training(lab: Any, cell: int, check: int) -> str:
    """Run the slow training cell, press the kernel's Interrupt inside a step, continue in the next cell;
    returns the check cell's KERNEL line."""
    import time

    flag = lab.server.root / "in_backward"
    flag.unlink(missing_ok=True)
    _run_nowait(lab, cell)
    lab.wait_until("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'busy'")
    time.sleep(1)  # a few steps (a foreground loop holds the kernel: the panels redraw when it ends)
    flag.unlink(missing_ok=True)
    deadline = time.monotonic() + 60
    while not flag.exists():  # the next backward pass began: the Interrupt lands in its 1 s (not in a step end)
        assert time.monotonic() < deadline, "the training cell never reached a backward pass"
        time.sleep(0.02)
    lab.page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.interrupt()")
    lab.wait_until("""(i) => window.jupyterapp.shell.currentWidget.content.widgets[i]
        .node.querySelector('.jp-OutputArea')?.textContent.includes('KeyboardInterrupt')""", arg=cell, timeout=60)
    tail = "\n".join(_output(lab, cell).splitlines()[-12:])
    facts = _until(lab, f"the panels saying where training was interrupted (the cell's output ends:\n{tail}\n)",
                   lambda f: all(p["failure"].startswith("interrupted in step") for p in f[:2]))
    assert "failed" not in facts[0]["failure"], facts
    time.sleep(0.5)
    lab.run_cell(cell + 1)  # the next cell trains on (train(3), normal speed)
    lab.run_cell(check)
    return next(ln for ln in _output(lab, check).splitlines() if ln.startswith("KERNEL"))


@pytest.mark.usefixtures("built_extension")
def test_notebook_cells_run_again_interrupted_and_two_debuggers_in_jupyterlab(lab_page: Any) -> None:
    """In JupyterLab, as a user goes: the ``Debugger`` cell run twice, the training cell run again under two
    panels of one debugger (both follow: header and control line), the timeline's first row clicked at a
    recent step (plotly's mode bar covered it) scrubbing *both* panels, the kernel's Interrupt inside a step
    and training on in the next cell (both panels say "interrupted", the next steps' tables are clean), and a
    second debugger closed while its panel is shown (only that panel reads closed). No traceback in the
    server's log meanwhile."""
    from test_ui_browser import shot

    lab = lab_page
    lab.page.set_viewport_size({"width": 1440, "height": 2600})
    lab.server.write_notebook("notebook4.ipynb", [
        SETUP, "dbg = nbdebug.Debugger(model)", "train(3)", "dbg", "dbg.panel()",
        "slow[0] = 1.0\ntrain(100000)", "slow[0] = 0.0\ntrain(3)", CHECK,
        "dbg2 = nbdebug.Debugger(model2)\ntrain(2, model2, opt2)\ndbg2", "dbg2.close()",
    ])
    lab.open_notebook("notebook4.ipynb")
    start = lab.server.log_path.stat().st_size
    for i in range(3):
        lab.run_cell(i)
    with pytest.raises(AssertionError, match="already attached to this Sequential; call close"):
        lab.run_cell(1)  # decision: refused, the first debugger (still `dbg`) stays attached and usable
    lab.run_cell(3)
    lab.run_cell(4)
    _until(lab, "two panels at step 2", lambda f: len(f) == 2 and all(p["step"] == "2" for p in f))
    lab.run_cell(2)  # the training cell again
    facts = _until(lab, "both panels at step 5, their control lines counting 6 steps",
                   lambda f: all(p["step"] == "5" and p["control"].startswith("6 steps recorded") for p in f))
    assert not any(p["error"] for p in facts), facts

    # the timeline of the first panel: plotly's mode bar covered the first row's latest steps (a click there
    # zoomed the chart); then a click on step 4 scrubs both panels
    lab.page.locator(f"{_PANEL} .nbdebug-timeline-toggle").first.click()
    lab.wait_until("""(sel) => { const gd = document.querySelector(sel + ' .nbdebug-timeline-plot.js-plotly-plot');
        return gd && gd._fullData && gd._fullData.length > 2; }""", arg=_PANEL, timeout=60)
    cell_xy = """([sel, step]) => {
        const gd = document.querySelector(sel + ' .nbdebug-timeline-plot.js-plotly-plot');
        const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
        return [box.left + xa._offset + xa.l2p(step), box.top + ya._offset + ya.l2p(0) - 4]; }"""
    lab.page.evaluate("""(sel) => document.querySelector(sel + ' .nbdebug-timeline-plot')
        .scrollIntoView({block: 'center'})""", _PANEL)
    x, y = lab.page.evaluate(cell_xy, [_PANEL, 5])
    lab.page.mouse.move(x, y)  # hovering the plot shows the mode bar
    lab.page.wait_for_timeout(400)
    overlap = lab.page.evaluate("""(sel) => {
        const gd = document.querySelector(sel + ' .nbdebug-timeline-plot.js-plotly-plot');
        const bar = gd.querySelector('.modebar').getBoundingClientRect(), box = gd.getBoundingClientRect();
        const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
        const heat = {top: box.top + ya._offset, bottom: box.top + ya._offset + ya._length,
                      left: box.left + xa._offset, right: box.left + xa._offset + xa._length};
        return bar.bottom > heat.top && bar.top < heat.bottom && bar.right > heat.left && bar.left < heat.right
            ? [bar.top, bar.bottom, heat.top] : null; }""", _PANEL)
    shot(lab, "heldout4-timeline-hover", f"{_PANEL} .nbdebug-timeline")
    assert overlap is None, f"plotly's mode bar lies over the heatmap's first row (top, bottom, heatmap top): {overlap}"
    before = lab.page.evaluate("""(sel) => document.querySelector(sel + ' .nbdebug-timeline-plot')
        ._fullLayout.xaxis.range.slice()""", _PANEL)
    lab.page.mouse.click(x, y)  # the first row's latest step
    lab.page.wait_for_timeout(600)
    after = lab.page.evaluate("""(sel) => document.querySelector(sel + ' .nbdebug-timeline-plot')
        ._fullLayout.xaxis.range.slice()""", _PANEL)
    assert after == before, f"a click on the first row's latest step zoomed the chart: {before} -> {after}"
    x, y = lab.page.evaluate(cell_xy, [_PANEL, 4])
    lab.page.mouse.move(x, y)  # plotly clicks the point it hovers
    lab.page.wait_for_timeout(400)
    lab.page.mouse.click(x, y)
    _until(lab, "both panels showing step 4 (scrubbed in the first)",
           lambda f: all(p["step"] == "4" for p in f), timeout=30)
    shot(lab, "heldout4-scrubbed-two-panels")
    lab.page.locator(f"{_PANEL} .nbdebug-timeline-latest").first.click()
    _until(lab, "both panels at the latest step again", lambda f: all(p["step"] == "5" for p in f), timeout=30)

    line = _interrupt_training(lab, 5, 7)
    assert line.endswith("clean None"), line
    last = int(line.split()[1]) - 1
    facts = _until(lab, "both panels at the kernel's last step, the interruption gone, the timeline too",
                   lambda f: all(p["step"] == str(last) and not p["failure"] for p in f)
                   and f"steps 0–{last} " in f[0]["timeline"] and f"showing step {last}" in f[0]["timeline"])
    shot(lab, "heldout4-after-interrupt", _PANEL)

    lab.run_cell(8)
    _until(lab, "the second debugger's panel", lambda f: len(f) == 3 and f[2]["step"] == "1")
    lab.run_cell(9)
    facts = _until(lab, "only the second debugger's panel closed",
                   lambda f: f[2]["state"] == "closed" and all(p["state"] == "idle" for p in f[:2]))
    assert "closed" in facts[2]["control"], facts
    shot(lab, "heldout4-closed-panel", f"{_PANEL} >> nth=2")
    log = lab.server.log_path.read_bytes()[start:].decode(errors="replace")
    assert "Traceback" not in log, log[-3000:]


def test_a_cell_interrupted_between_backward_and_optimizer_step_leaves_its_step_alone() -> None:
    """The Interrupt raised once the backward pass returned (its C++ work done) and before ``opt.step()`` — where
    a long backward's Interrupt lands: nothing tells that iteration from a gradient-accumulation one, so the next
    cell's first iteration was recorded into its step. The cell's end (IPython's ``post_run_cell``, which a shown
    panel hooks) closes it: the next steps are whole, and both panels say where training was interrupted."""
    from nbdebug.ui.panel import after_cell

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def train(n: int, stop: bool = False) -> None:
        for _ in range(n):
            opt.zero_grad()
            model(torch.randn(2, 4)).pow(2).mean().backward()
            if stop:
                raise KeyboardInterrupt
            opt.step()

    with nbdebug.Debugger(model) as dbg:
        train(2)
        panels = [dbg.panel(), dbg.panel()]
        try:
            train(1, stop=True)
        except KeyboardInterrupt as e:
            after_cell(type("Result", (), {"error_in_exec": e})())
        for p in panels:
            p.flush()
            want = "interrupted in step 2 at Module.0.Linear.backward.0 (KeyboardInterrupt)</span>"
            assert p.header.failure.value.endswith(want), p.header.failure.value
        assert dbg.step_index == 3
        train(2)
        whole = set(dbg.session.steps[1].keys)
        assert all(set(dbg.session.steps[i].keys) == whole and len(dbg.session.steps[i].keys) == len(whole)
                   for i in (3, 4)), [len(dbg.session.steps[i].keys) for i in (1, 2, 3, 4)]
        assert set(dbg.session.steps[2].keys) < whole  # no optimizer step in the interrupted one
        for p in panels:
            p.flush()
            assert not p.header.failure.value, p.header.failure.value
            p.close()


def test_an_interrupt_inside_a_redraw_request_does_not_stop_later_redraws() -> None:
    """A foreground training loop marks the panel's parts on every step, on the kernel's main thread: the
    Interrupt landing inside ``Coalescer.mark`` (after it promised a redraw, before the event loop had it) left
    the redraw promised for good, so that view never redrew again (the timeline stayed at the interrupted step
    while the header went on)."""
    from nbdebug.ui.throttle import Coalescer

    class Loop:
        interrupt = True
        calls: list = []

        def is_closed(self) -> bool:
            return False

        def call_soon_threadsafe(self, fn, *args):
            if Loop.interrupt:
                Loop.interrupt = False
                raise KeyboardInterrupt
            Loop.calls.append((fn, args))

    c = Coalescer(lambda parts: None, loop=Loop())
    with pytest.raises(KeyboardInterrupt):
        c.mark("timeline")
    c.mark("timeline")  # the next step's event
    assert len(Loop.calls) == 1, "no redraw was scheduled after the interrupted one"


@pytest.mark.usefixtures("built_extension")
def test_interrupt_train_on_and_restart_run_all_in_notebook_7(nb_page: Any) -> None:
    """In Jupyter Notebook 7: two panels of one debugger, the kernel's Interrupt inside a step (the panels say
    "interrupted in step N at …"), training on in the next cell (clean steps, both panels at the kernel's last
    step), then "Restart kernel and run all": the re-run cells' panels are live (no stale banner, no error) and
    agree with the new kernel."""
    from test_ui_browser import shot

    lab = nb_page
    lab.page.set_viewport_size({"width": 1440, "height": 2400})
    lab.server.write_notebook("notebook4-nb7.ipynb", [
        SETUP, "dbg = nbdebug.Debugger(model)\ntrain(3)\ndbg", "dbg.panel()",
        "slow[0] = 1.0\ntrain(8)", "slow[0] = 0.0\ntrain(3)", CHECK,
    ])
    lab.open_notebook("notebook4-nb7.ipynb")
    assert lab.page.evaluate("() => window.jupyterapp.name") == "Jupyter Notebook"
    start = lab.server.log_path.stat().st_size
    for i in range(3):
        lab.run_cell(i)
    _until(lab, "two panels at step 2", lambda f: len(f) == 2 and all(p["step"] == "2" for p in f))
    line = _interrupt_training(lab, 3, 5)
    assert line.endswith("clean None"), line
    last = int(line.split()[1]) - 1
    _until(lab, "both panels at the kernel's last step", lambda f: all(p["step"] == str(last) for p in f))
    shot(lab, "heldout4-nb7-after-interrupt")

    lab.page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.restartKernel()")
    lab.wait_until("""() => { const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
        return k && k.status === 'idle'; }""", timeout=90)
    lab.run_all()
    lab.wait_until("""() => { const w = window.jupyterapp.shell.currentWidget.content.widgets[5];
        const o = w.node.querySelector('.jp-OutputArea')?.textContent ?? '';
        return o.includes('KERNEL 14 clean None'); }""", timeout=180)  # 3 + 8 + 3 steps
    facts = _until(lab, "two live panels at step 13 after restart and run all",
                   lambda f: len(f) == 2 and all(p["step"] == "13" and p["state"] == "idle" for p in f))
    assert not any(p["error"] or p["failure"] for p in facts), facts
    assert lab.page.locator(f"{_PANEL}.nbdebug-stale").count() == 0
    shot(lab, "heldout4-nb7-restart-run-all")
    log = lab.server.log_path.read_bytes()[start:].decode(errors="replace")
    assert "Traceback" not in log, log[-3000:]


def test_a_monitor_level_timeline_click_says_the_level_keeps_no_tensor_statistics() -> None:
    """A 250-step run at ``level="monitor"``: a click on step 150 of its timeline answered "step 150 fell out of
    the statistics window … Debugger(stats_window=N) keeps more … ask stats(node, slot, step, fields=[...])" —
    neither helps at that level, which records no tensor statistics at all. It says so now."""
    model, train = _plain_training()
    with nbdebug.Debugger(model, level="monitor") as dbg:
        train(250)
        panel = dbg.panel()
        panel.timeline.show(True)
        panel.flush()
        why = panel.timeline.scrub(150)
        assert why is not None and "level 'monitor' records the series this timeline shows" in why, why
        assert "stats_window" not in why and "150" in panel.timeline.note.value, panel.timeline.note.value
        assert "249" in panel.header.step.value
        panel.close()


def test_an_interrupted_blocking_run_reads_interrupted_in_the_control_line() -> None:
    """``dbg.run(train, block=True)`` in a cell, stopped with the kernel's Interrupt: the control line said
    "Training failed: KeyboardInterrupt"; it says "Training interrupted" (the header's line says where)."""
    model, train = _plain_training()

    def loop() -> None:
        train(2)
        raise KeyboardInterrupt

    with nbdebug.Debugger(model) as dbg:
        with pytest.raises(KeyboardInterrupt):
            dbg.run(loop, block=True)
        panel = dbg.panel()
        panel.flush()
        assert "Training interrupted: KeyboardInterrupt" in panel.controls.status.value, panel.controls.status.value
        assert "interrupted" in panel.header.failure.value, panel.header.failure.value
        panel.close()
