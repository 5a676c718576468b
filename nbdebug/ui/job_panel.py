"""The panel of a job of several ranks (:class:`nbdebug.job.Job`): the usual panel over one rank at a time.

It is the panel of a listener too (``nbdebug.listen()``; ``listener.panel()`` is ``listener.job.panel()``):
ranks appear as their processes connect. Above the usual :class:`~nbdebug.ui.panel.Panel` of the chosen
rank, one bar:

* for live ranks, the process table (``nbdebug-process-table``: rank, host, PID, device, step, state of each
  process; "waiting for training processes on ADDRESS" before any connected);
* a rank selector (``nbdebug-rank-select``): every view of the panel below — graph, node list, details,
  watchpoints, hits, tensor view — switches to that rank's source; the selected node and (offline) the
  step are kept when the other rank has them;
* the first non-finite rank (``nbdebug-job-first``: "first non-finite: rank R, node N, step S") and a
  button that shows it (``nbdebug-job-first-show``: that rank, step and node);
* job control (``nbdebug-job-pause``, ``-cont``, ``-step``, ``-terminate``; ``nbdebug-job-status`` says what
  it did) when ranks are live: every rank together, at a step boundary (the rank panel's own controls are
  hidden in a job of several ranks, since a rank paused alone would block the others in their next
  collective);
* the per-rank overview (``nbdebug-job-overview``): hits per rank, and per step non-finite tensors and
  the largest finite magnitude of each rank (the first non-finite cell outlined);
* a rank-vs-rank compare (``nbdebug-job-compare-a``, ``-b``, ``-step``, ``nbdebug-job-compare``): the
  two-run compare panel over two ranks' same step (``nbdebug-job-compare-box`` holds it).

Displayed, it is followed by its static snapshot (``nbdebug-job-snapshot``: the first non-finite line, the
overview and the shown rank's panel snapshot), kept current and hidden while the widget is drawn, so a saved
notebook shows the job without a kernel.

>>> from nbdebug.session.session import Session
>>> from nbdebug.offline import OfflineSession
>>> from nbdebug.job import Job
>>> p = JobPanel(Job({r: OfflineSession(Session(framework="pytorch")) for r in (0, 1)}))
>>> p.rank, p.rank_select.options, p.first.value
(0, (('rank 0', 0), ('rank 1', 1)), 'first non-finite: none')
>>> from types import SimpleNamespace
>>> group = SimpleNamespace(pause_all=int, cont_all=print, terminate_all=int, address="127.0.0.1:5555")
>>> JobPanel(Job({}, control=group)).processes.value     # a listener nothing connected to yet
'<i>waiting for training processes on 127.0.0.1:5555</i>'
"""

from __future__ import annotations

import html
import time
import traceback
import weakref
from typing import Any

import ipywidgets as w

from .job_timeline import JobTimelineView
from .panel import SNAPSHOT_SECONDS, Panel
from .snapshot import snapshot_html
from .source import EVENTS, SourceView
from .throttle import _AUTO, Coalescer

#: steps the overview shows (the last ones)
OVERVIEW_STEPS = 8


class JobPanel(w.VBox):
    """The panel of ``job``: a bar (rank selector, first non-finite, job control, overview, rank compare) over
    the :class:`Panel` of the selected rank."""

    def __init__(self, job: Any, *, rank: int | None = None, rate: float = 10.0, loop: Any = _AUTO) -> None:
        self.job = job
        self._rate, self._loop = rate, loop
        self.errors: list[str] = []
        self.processes = w.HTML("", _dom_classes=("nbdebug-processes",))
        self.rank_select = w.Dropdown(options=[], description="Rank", layout=w.Layout(width="150px"),
                                      style={"description_width": "36px"}, _dom_classes=("nbdebug-rank-select",))
        self.first = w.HTML("", _dom_classes=("nbdebug-job-first",))
        self.first_button = w.Button(description="show", layout=w.Layout(width="auto"), disabled=True,
                                     _dom_classes=("nbdebug-job-first-show",))
        self.first_button.on_click(lambda _b: self.show_first())
        self.buttons: dict[str, w.Button] = {}
        if job.live or job.control is not None:
            for name, label, act in (("pause", "pause all", job.pause), ("cont", "continue all", job.cont),
                                     ("step", "step all", lambda: job.cont(1)),
                                     ("terminate", "terminate all", job.terminate)):
                b = w.Button(description=label, layout=w.Layout(width="auto"), _dom_classes=(f"nbdebug-job-{name}",))
                b.on_click(lambda _b, act=act: self._act(act))
                self.buttons[name] = b
        self.status = w.HTML("", _dom_classes=("nbdebug-job-status",))
        self.overview = w.HTML("", _dom_classes=("nbdebug-job-overview",))
        self.compare_a = self._rank_dropdown("nbdebug-job-compare-a")
        self.compare_b = self._rank_dropdown("nbdebug-job-compare-b")
        self.compare_step = w.Dropdown(options=[], description="step", layout=w.Layout(width="130px"),
                                       style={"description_width": "32px"}, _dom_classes=("nbdebug-job-compare-step",))
        self.compare_button = w.Button(description="compare ranks", layout=w.Layout(width="auto"),
                                       _dom_classes=("nbdebug-job-compare",))
        self.compare_button.on_click(lambda _b: self._compare_clicked())
        self.compare_box = w.VBox([], _dom_classes=("nbdebug-job-compare-box",))
        self.compare_panel: Any = None
        self._snapshots: list[Any] = []  # display handles of the static snapshots
        self._snapshot_at = 0.0
        self.panel: Panel | None = None
        self.rank: Any = None
        bar = w.HBox([self.rank_select, self.first, self.first_button, *self.buttons.values(), self.status],
                     layout=w.Layout(align_items="center", flex_flow="row wrap"))
        compare = w.HBox([w.HTML("<b>Compare</b>&nbsp;"), self.compare_a, w.HTML("&nbsp;vs&nbsp;"),
                          self.compare_b, self.compare_step, self.compare_button],
                         layout=w.Layout(align_items="center"))
        #: ranks × steps of one series; a click selects that rank and step (closed until toggled)
        self.timeline = JobTimelineView(job, on_pick=self.pick)
        self._bar = w.VBox(([self.processes] if self.buttons else []) + [bar, self.overview, compare,
                                                                         self.compare_box, self.timeline.widget],
                           _dom_classes=("nbdebug-job-bar",))
        super().__init__([self._bar], _dom_classes=("nbdebug-job-panel",))
        self.coalescer = Coalescer(lambda _parts: self.refresh(), rate=rate, loop=loop)
        ref = weakref.ref(self)

        def mark(_payload: Any) -> None:
            panel = ref()
            if panel is not None:
                panel.coalescer.mark("job")

        self._mark = mark
        self._subs: list[Any] = []
        self._followed: list[Any] = []  # the ranks whose events are followed
        hub = getattr(job, "hub", None)
        if hub is not None:  # ranks joining (a listener's processes connecting)
            self._subs.append(hub.on("state", mark))
        self._follow_ranks()
        if job.ranks:
            self.select_rank(job.ranks[0] if rank is None else rank)
        self.rank_select.observe(self._chosen, names="value")
        self.refresh()

    def _follow_ranks(self) -> None:
        """Keep the selectors and event subscriptions in step with the job's ranks (they may grow)."""
        ranks = self.job.ranks
        followed = [(r, self.job.source(r)) for r in ranks]
        if len(followed) == len(self._followed) and all(a is b for (_r, a), (_q, b) in zip(followed, self._followed,
                                                                                          strict=True)):
            return
        known = {id(src) for _r, src in self._followed}
        for _r, src in followed:
            if id(src) not in known:
                self._subs += [SourceView(src).on(ev, self._mark) for ev in EVENTS]
        self._followed = followed
        if self.panel is not None and self.rank in ranks and self.panel.source.obj is not self.job.source(self.rank):
            shown, self.rank = self.rank, None  # that rank's process was replaced (restarted): show the new one
            self.select_rank(shown)
        options = [(rank_label(r), r) for r in ranks]
        self._moving = True  # new options: not the user choosing a rank
        try:
            for dd, default in ((self.rank_select, ranks[0]), (self.compare_b, ranks[0]), (self.compare_a, ranks[-1])):
                keep = dd.value
                dd.options = options
                dd.value = keep if keep in ranks else default
            if len(ranks) > 1 and self.compare_a.value == self.compare_b.value:  # two ranks to compare
                self.compare_a.value = next(r for r in reversed(ranks) if r != self.compare_b.value)
        finally:
            self._moving = False
        if self.panel is not None and self.panel.controls is not None and len(ranks) > 1:
            self.panel.controls.widget.layout.display = "none"

    _moving = False

    def _chosen(self, change: dict[str, Any]) -> None:
        if change["new"] is not None and not self._moving:
            self.select_rank(change["new"])

    def _rank_dropdown(self, css: str) -> w.Dropdown:
        dd = w.Dropdown(options=[], layout=w.Layout(width="100px"), _dom_classes=(css,))
        return dd

    # -- the rank shown ----------------------------------------------------------------------------
    def select_rank(self, rank: int) -> Panel:
        """Show ``rank``'s source in every view (keeping the selected node and offline step when it has them).
        A remote rank in summary mode (many ranks) sends its full tables while it is shown (``job.rank``)."""
        if self.panel is not None and self.rank == rank:
            return self.panel
        try:
            src = self.job.rank(rank)
        except (TimeoutError, RuntimeError) as e:  # the process did not answer: its summaries are still shown
            src = self.job.source(rank)
            self.status.value = html.escape(f"rank {rank}: no full statistics ({e})")
        previous = self.job.source(self.rank) if self.panel is not None and self.rank in self.job.ranks else None
        if getattr(previous, "full", False) and getattr(previous, "connected", False):
            try:
                previous.full_tables(False)  # summaries alone again for the rank no longer shown
            except (TimeoutError, RuntimeError):
                pass
        old = self.panel
        node = old.selected if old is not None else None
        step = old.source.step if old is not None and not old.source.live else None
        panel = Panel(src, rate=self._rate, recommend=False, loop=self._loop)
        if panel.controls is not None and len(self.job) > 1:
            panel.controls.widget.layout.display = "none"  # one rank alone must not be paused (see module doc)
        panel.watch.set_job(self.job)  # its "+" form offers ODD_RANK, set on the job
        self.panel, self.rank = panel, rank
        if self.rank_select.value != rank:
            self.rank_select.value = rank
        if step is not None and step in panel.source.steps and step != panel.source.step:
            panel.goto(step)
        if node is not None and node in panel.source.graph.nodes:
            panel.select(node)
        self.children = [self._bar, panel]
        if old is not None:
            old.close()
        self._snapshot_at = 0.0  # the saved state follows the rank shown
        self._update_snapshot()
        return panel

    def pick(self, rank: Any, step: int) -> str | None:
        """Select ``rank`` and show its ``step`` (a click on the ranks × steps timeline); why not, if not."""
        panel = self.select_rank(rank)
        why = panel.scrub(step)
        panel.timeline.note.value = "" if why is None else f"<span style='color:#9a6700'>⚠ {html.escape(why)}</span>"
        return why

    def show_first(self) -> Any:
        """Show the first non-finite origin: its rank, its step (offline) and its node selected."""
        first = self.job.first_nonfinite()
        if first is None:
            return None
        panel = self.select_rank(first.rank)
        if not panel.source.live and first.step != panel.source.step:
            panel.goto(first.step)
        panel.select(first.node)
        return first

    # -- job facts ---------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Recompute the process table, the ranks, the first non-finite line, the overview and the compare
        steps."""
        try:
            job = self.job
            self._follow_ranks()
            if self.panel is None and job.ranks:
                self.select_rank(job.ranks[0])
            self.processes.value = processes_html(job)
            first = job.first_nonfinite()
            self.first.value = f"first non-finite: {html.escape(str(first))}" if first else "first non-finite: none"
            self.first_button.disabled = first is None
            self.overview.value = overview_html(job, first)
            steps = job.steps
            if list(self.compare_step.options) != [(f"{s}", s) for s in steps]:
                keep = self.compare_step.value
                self.compare_step.options = [(f"{s}", s) for s in steps]
                self.compare_step.value = keep if keep in steps else (steps[-1] if steps else None)
            self.compare_button.disabled = not steps
            notice = getattr(job.control, "notice", "")
            if notice:
                self.status.value = f"<span style='color:#9a6700'>{html.escape(notice)}</span>"
            self._update_snapshot()
        except Exception:  # noqa: BLE001 - a failing summary must not take the panel down
            self.errors.append(traceback.format_exc())

    def flush(self) -> None:
        """Redraw what changed now (the job bar and the rank's panel)."""
        self.coalescer.flush()
        if self.panel is not None:
            self.panel.flush()

    def _act(self, action: Any) -> None:
        try:
            result = action()
            self.status.value = f"pausing every rank after step {result}" if isinstance(result, int) else ""
        except Exception as e:  # noqa: BLE001 - shown, not raised into the widget callback
            self.errors.append(traceback.format_exc())
            self.status.value = f"<span style='color:#cf222e'>{html.escape(str(e))}</span>"
        self.coalescer.mark("job")
        self.coalescer.flush()

    # -- rank vs rank --------------------------------------------------------------------------------
    def compare(self, a: int | None = None, b: int | None = None, step: int | None = None) -> Any:
        """Compare rank ``a`` with rank ``b`` in ``step`` (default: the compare row's choices) and show it."""
        from .compare_panel import ComparePanel

        a = self.compare_a.value if a is None else a
        b = self.compare_b.value if b is None else b
        step = self.compare_step.value if step is None else step
        result = self.job.compare_ranks(a, b, step)
        self.compare_panel = ComparePanel(result, labels=(rank_label(a), rank_label(b)), graphs=False)
        self.compare_box.children = [self.compare_panel.widget]
        return self.compare_panel

    def _compare_clicked(self) -> None:
        """The compare button: a compare that fails shows its error in the compare box (and ``errors``)."""
        self.compare_box.children = [w.HTML("<i>comparing…</i>")]
        try:
            self.compare()
        except Exception as e:  # noqa: BLE001 - shown, not raised into the widget callback
            self.errors.append(traceback.format_exc())
            box = w.HTML(f"<span style='color:#cf222e'>compare failed: {html.escape(type(e).__name__)}: "
                         f"{html.escape(str(e))}</span>", _dom_classes=("nbdebug-job-compare-error",))
            self.compare_box.children = [box]

    # -- the static snapshot (a saved notebook without a kernel) --------------------------------------
    def snapshot_html(self) -> str:
        """Static HTML of what the job panel shows: the first non-finite line, the overview and the shown
        rank's panel (see :mod:`nbdebug.ui.snapshot`)."""
        job_part = (f"<div class='nbdebug-snapshot nbdebug-job-snapshot' style='font-size:13px'><b>Rank "
                    f"{self.rank}</b> of {self.job.ranks} &nbsp; {self.first.value}{self.overview.value}</div>")
        return job_part + (snapshot_html(self.panel.source) if self.panel is not None else "")

    def _ipython_display_(self, **kwargs: Any) -> None:
        """Display the widget and, after it, its static snapshot (kept current, hidden while the widget is
        drawn), as the rank panel does."""
        from IPython.display import HTML, display

        display(self._repr_mimebundle_(**kwargs), raw=True)
        self._snapshots.append(display(HTML(self.snapshot_html()), display_id=True))
        self._snapshot_at = time.monotonic()

    def _update_snapshot(self) -> None:
        if not self._snapshots or time.monotonic() - self._snapshot_at < SNAPSHOT_SECONDS:
            return
        from IPython.display import HTML

        text = self.snapshot_html()
        for handle in self._snapshots:
            handle.update(HTML(text))
        self._snapshot_at = time.monotonic()

    def close(self) -> None:
        for off in self._subs:
            off()
        self._subs = []
        if self.panel is not None:
            self.panel.close()
        super().close()


def overview_html(job: Any, first: Any = None, last: int = OVERVIEW_STEPS) -> str:
    """The per-rank table: hits, then per step (the last ``last``) non-finite tensors and largest finite |x|."""
    steps = job.steps[-last:]
    over = job.overview(steps)
    hits = job.hit_counts()
    head = "<th>rank</th><th>hits</th>" + "".join(f"<th>step {s}</th>" for s in steps)
    body = []
    for r in job.ranks:
        cells = [f"<td><b>{r}</b></td>", f"<td>{hits.get(r, 0)}</td>"]
        for s in steps:
            sm = over.get(s, {}).get(r)
            if sm is None:
                cells.append("<td>–</td>")
                continue
            mag = f"{sm.max_abs:.3g}" if sm.max_abs is not None else "–"
            bg = "#f4b6b6" if sm.nonfinite_tensors else "#ffffff"
            edge = "border:2px solid #cf222e;" if first is not None and (first.rank, first.step) == (r, s) else ""
            cells.append(f"<td style='background:{bg};{edge}' title='non-finite tensors · max |x|'>"
                         f"{sm.nonfinite_tensors} · {mag}</td>")
        body.append(f"<tr data-rank='{r}'>{''.join(cells)}</tr>")
    if not steps:
        return "<i>no finished step yet</i>"
    return (f"<table cellpadding='3' style='border-collapse:collapse;font-size:12px'><tr>{head}</tr>"
            f"{''.join(body)}</table>")


def rank_label(rank: Any) -> str:
    """``rank 2``; a process outside a distributed job by its ``host:pid``."""
    return f"rank {rank}" if isinstance(rank, int) else str(rank)


PROCESS_COLUMNS = (("rank", "rank"), ("host", "host"), ("PID", "pid"), ("device", "device"), ("step", "step"),
                   ("state", "state"))


def process_rows(job: Any) -> list[dict[str, Any]]:
    """One row per live rank: rank, host, pid, device, step (the one it runs), state — a remote rank's
    ``remote_info``, else what its session knows (this host, this process)."""
    import socket

    rows = []
    for r in job.ranks:
        src = job.source(r)
        view = SourceView(src)
        if not view.live:
            continue
        info = getattr(src, "remote_info", None) or {"host": socket.gethostname(), "pid": src.session.pid,
                                                     "device": src.session.device}
        rows.append({"rank": rank_label(r).removeprefix("rank "), "host": info.get("host"), "pid": info.get("pid"),
                     "device": info.get("device"), "step": view.running_step, "state": view.state})
    return rows


def processes_html(job: Any) -> str:
    """The process table of a live job (empty for an offline one)."""
    rows = process_rows(job)
    if not rows:
        where = getattr(job.control, "address", None)
        return f"<i>waiting for training processes on {html.escape(where)}</i>" if where and not job.ranks else ""
    head = "".join(f"<th>{h}</th>" for h, _k in PROCESS_COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str('–' if r[k] is None else r[k]))}</td>"
                                    for _h, k in PROCESS_COLUMNS) + "</tr>" for r in rows)
    return f"<table class='nbdebug-process-table' cellpadding='3'><tr>{head}</tr>{body}</table>"
