"""Watchpoints: the list (enable/disable, the selected node in or out, delete), clear all, recheck, and the
"+" form that creates one.

The form offers the 17 conditions grouped by category (tensor, weight, gradient, activation), then the
watchpoints over time (SPIKE, DRIFT, STALL; ODD_RANK too on a job's panel, where it is set on the job, since
it compares the ranks); choosing one shows its parameter fields with their defaults, labelled in
MindInsight's words ("Average of the absolute value >", "max >", "Percentage of 0 values ≥", "Lower limit
of the range (inclusive)", …; the parameter's name is the field's tooltip); a temporal ``field`` is typed or
picked from the statistics and monitor fields. OK checks every field at once: each bad value gets its message
under its own field, at the form's full width; what the condition says about the fields together (e.g. a
range percentage without both range ends) is checked by the debugger and shown under the field it names
(or under the form). On any error nothing is created and the form stays open with what was typed.

>>> label("abs_mean_gt"), label("zero_percentage_ge"), label("max_min_lt")
('Average of the absolute value >', 'Percentage of 0 values ≥', 'MAX-MIN <')
>>> [abbr for _text, abbr in condition_options(job=True)][-4:]
['SPIKE', 'DRIFT', 'STALL', 'ODD_RANK']
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any

import ipywidgets as w

from ..watch.conditions import CATEGORIES, CONDITIONS
from ..watch.registry import TEMPORAL, TEMPORAL_CATEGORY
from ..watch.validation import SERIES_FIELDS
from ..watch.watchpoints import count_hits
from .kit import Kit
from .source import SourceView

_CATEGORY_LABEL = {"tensor": "Tensor check", "weight": "Weight check", "gradient": "Gradient check",
                   "activation": "Activation check", TEMPORAL_CATEGORY: "Over time"}
_PARAM_RE = re.compile(r"parameter '([A-Za-z_0-9]+)'")
_NAMED_RE = re.compile(r"\b(range_[a-z_]+|[a-z_]+_(?:gt|lt|ge))\b")

#: MindInsight's wording of each parameter (its debugger guide, "Creating a watchpoint").
LABELS: dict[str, str] = {
    "abs_mean_gt": "Average of the absolute value >", "abs_mean_lt": "Average of the absolute value <",
    "max_gt": "max >", "max_lt": "max <", "min_gt": "min >", "min_lt": "min <",
    "mean_gt": "mean >", "mean_lt": "mean <",
    "zero_percentage_ge": "Percentage of 0 values ≥",
    "range_start_inclusive": "Lower limit of the range (inclusive)",
    "range_end_inclusive": "Upper limit of the range (inclusive)",
    "range_percentage_gt": "Percentage of the value in the range >",
    "range_percentage_lt": "Percentage of the value in the range <",
    "max_min_gt": "MAX-MIN >", "max_min_lt": "MAX-MIN <",
    "abs_mean_update_ratio_gt": "Average change ratio >", "abs_mean_update_ratio_lt": "Average change ratio <",
    "epsilon": "Offset", "rtol": "Relative tolerance", "atol": "Absolute tolerance",
    "equal_nan": "NaN equals NaN",
    # the watchpoints over time (not MindInsight's)
    "field": "Series field", "factor": "× |rolling median| >", "window": "Window (steps)",
    "z": "|z-score| >", "below": "value <", "steps": "for consecutive steps",
}


def label(name: str) -> str:
    """The form's label of parameter ``name`` (its name when MindInsight has no wording for it)."""
    return LABELS.get(name, name)


def condition_options(job: bool = False) -> list[tuple[str, str]]:
    """Dropdown options: conditions grouped by category, e.g. ``("Tensor check · TO — tensor overflow", "TO")``,
    then those over time (``ODD_RANK`` only on a job's panel: ``job=True``)."""
    out = []
    for cat in CATEGORIES:
        for c in CONDITIONS.values():
            if c.category == cat:
                out.append((f"{_CATEGORY_LABEL[cat]} · {c.abbr} — {c.name}", c.abbr))
    for c in TEMPORAL.values():
        if job or c.abbr != "ODD_RANK":
            out.append((f"{_CATEGORY_LABEL[TEMPORAL_CATEGORY]} · {c.abbr} — {c.name}", c.abbr))
    return out


def _all_conditions() -> dict[str, Any]:
    return {**CONDITIONS, **TEMPORAL}


class _Field:
    """One parameter: its label and input on a line, its error message below at full width."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        text = label(spec.name)
        classes = (f"nbdebug-wp-param-{spec.name}", "nbdebug-wp-param")  # given at creation: no update message
        if spec.rule == "bool":
            self.input: Any = w.Checkbox(value=bool(spec.default), description=text, indent=False,
                                         tooltip=spec.name, _dom_classes=classes)
            line: Any = self.input
        else:
            if spec.rule == "field":  # a series field: typed (checked on OK) or picked from the suggestions
                self.input = w.Combobox(value=str(spec.default), options=list(SERIES_FIELDS), ensure_option=False,
                                        placeholder=spec.range_text, tooltip=spec.name,
                                        layout=w.Layout(width="160px", flex="0 0 auto"), _dom_classes=classes)
            else:
                self.input = w.Text(value=_default_text(spec), placeholder=spec.range_text, tooltip=spec.name,
                                    layout=w.Layout(width="120px", flex="0 0 auto"), _dom_classes=classes)
            name = w.HTML(f"<span title='{html.escape(spec.name)}'>{html.escape(text)}</span>",
                          layout=w.Layout(flex="1 1 180px"), _dom_classes=("nbdebug-wp-label-text",))
            line = w.HBox([name, self.input], layout=w.Layout(align_items="center", width="100%"))
        self.error = w.HTML("", layout=w.Layout(width="100%"),
                            _dom_classes=("nbdebug-wp-error", f"nbdebug-wp-error-{spec.name}"))
        self.widget = w.VBox([line, self.error], layout=w.Layout(width="100%"), _dom_classes=("nbdebug-wp-field",))

    def value(self, abbr: str) -> Any:
        """The typed value (None when empty); ``ValueError`` with the field's message when it is bad."""
        if self.spec.rule == "bool":
            return bool(self.input.value)
        text = self.input.value.strip()
        if not text:
            return None
        if self.spec.rule == "field":
            if text not in SERIES_FIELDS:
                raise ValueError("must be a statistic or a monitor field (e.g. norm, update_ratio, loss), "
                                 f"got {text!r}")
            return text
        finite = self.spec.rule == "finite"
        try:
            x = float(text)
        except ValueError:
            raise ValueError(f"must be a number{'' if finite else f' ({self.spec.range_text})'}, got {text!r}") \
                from None
        if not self.spec.allows(x):
            raise ValueError(f"must be {'a finite number' if finite else self.spec.range_text}, got {text}")
        return int(x) if self.spec.rule in ("window", "count") else x


def _default_text(spec: Any) -> str:
    """A number field's default as typed: ``50`` for a whole-number rule, ``10.0`` for a threshold."""
    if spec.default is None:
        return ""
    return str(int(spec.default)) if spec.rule in ("window", "count") else repr(float(spec.default))


class WatchPanel:
    """Watchpoint list and creation form; ``selected()`` gives the panel's selected node (or None)."""

    def __init__(self, source: SourceView, selected: Callable[[], str | None] = lambda: None,
                 on_change: Callable[[], Any] = lambda: None) -> None:
        self.source = source
        self.selected = selected
        self.on_change = on_change
        #: the job whose panel this is (:meth:`set_job`): ODD_RANK is offered and set on the job
        self.job: Any = None
        self._sig: Any = None
        self._counts: dict[tuple[int, int, Any], int] = {}
        self._kit = kit = Kit()  # the labels' and buttons' Layout and style models, shared
        self.add = _button(kit, "+", "nbdebug-wp-add", "new watchpoint")
        self.recheck = _button(kit, "recheck", "nbdebug-wp-recheck", "check the current step again")
        self.clear = _button(kit, "clear all", "nbdebug-wp-clear", "delete every watchpoint")
        self.add.on_click(lambda _b: self.open_form())
        self.recheck.on_click(lambda _b: self.do_recheck())
        self.clear.on_click(lambda _b: self.clear_all())
        self.message = kit.html(classes=("nbdebug-wp-message",))
        self.list = w.VBox([], _dom_classes=("nbdebug-wp-list",))
        # the form
        self.condition = w.Dropdown(options=condition_options(), value="TO", description="Condition",
                                    layout=w.Layout(width="100%", max_width="420px"),
                                    _dom_classes=("nbdebug-wp-condition",))
        self.condition.observe(lambda ch: self._build_fields(), names="value")
        self.summary = kit.html(classes=("nbdebug-wp-summary",))
        self.params = w.VBox([], layout=w.Layout(width="100%"), _dom_classes=("nbdebug-wp-params",))
        self.only_selected = w.Checkbox(value=False, description="only the selected node", indent=False,
                                        _dom_classes=("nbdebug-wp-only-selected",))
        self.create = _button(kit, "OK", "nbdebug-wp-create", "create the watchpoint", button_style="primary")
        self.cancel = _button(kit, "cancel", "nbdebug-wp-cancel", "")
        self.create.on_click(lambda _b: self.submit())
        self.cancel.on_click(lambda _b: self.close_form())
        self.form_error = w.HTML("", layout=w.Layout(width="100%"),
                                 _dom_classes=("nbdebug-wp-error", "nbdebug-wp-form-error"))
        self.form = w.VBox([self.condition, self.summary, self.params, self.only_selected,
                            w.HBox([self.create, self.cancel]), self.form_error],
                           layout=w.Layout(display="none", border="1px solid #ccc", padding="4px",
                                           width="100%"), _dom_classes=("nbdebug-wp-form",))
        self.fields: dict[str, _Field] = {}
        self._build_fields()
        self.widget = w.VBox([w.HBox([kit.html("<b>Watchpoints</b>"), self.add, self.recheck, self.clear]),
                              self.form, self.list, self.message], _dom_classes=("nbdebug-watchpoints",))
        self.refresh()

    # -- form -------------------------------------------------------------------------------------
    def open_form(self) -> None:
        self._build_fields()
        self.form.layout.display = "flex"

    def close_form(self) -> None:
        self.form.layout.display = "none"

    @property
    def form_open(self) -> bool:
        return self.form.layout.display != "none"

    def _build_fields(self) -> None:
        cond = _all_conditions()[self.condition.value]
        self.fields = {p.name: _Field(p) for p in cond.params}
        self.params.children = [f.widget for f in self.fields.values()] or [w.HTML("<i>no parameters</i>")]
        self.summary.value = f"<small>{html.escape(cond.summary)}</small>"
        self.form_error.value = ""

    def set_job(self, job: Any) -> None:
        """This form is a job's (:class:`~nbdebug.ui.job_panel.JobPanel`): offer ODD_RANK, set on ``job``."""
        self.job = job
        keep = self.condition.value
        self.condition.options = condition_options(job=job is not None)
        self.condition.value = keep if keep in dict((v, t) for t, v in self.condition.options) else "TO"

    def field(self, name: str) -> Any:
        """The input widget of parameter ``name`` in the form."""
        return self.fields[name].input

    def errors(self) -> dict[str, str]:
        """Validation messages shown now: parameter name (or ``"form"``) -> text."""
        out = {n: _plain(f.error.value) for n, f in self.fields.items() if f.error.value}
        if self.form_error.value:
            out["form"] = _plain(self.form_error.value)
        return out

    def submit(self) -> Any:
        """Create the watchpoint from the form; returns it, or None when the input is invalid (every
        field's problem is shown under that field; the form stays open with what was typed)."""
        abbr = self.condition.value
        for f in self.fields.values():
            f.error.value = ""
        self.form_error.value = ""
        params: dict[str, Any] = {}
        bad = False
        for n, f in self.fields.items():
            try:
                v = f.value(abbr)
            except ValueError as e:
                f.error.value = _error_html(str(e))
                bad = True
                continue
            if v is not None:
                params[n] = v
        nodes = None
        if self.only_selected.value:
            nodes = self.selected()
            if nodes is None:
                self.form_error.value = _error_html(f"{abbr}: 'only the selected node' is ticked but no node "
                                                    "is selected")
                bad = True
        if bad:
            return None
        try:
            wp = self._watch(abbr, nodes, params)
        except (ValueError, TypeError) as e:
            self._show_error(str(e))
            return None
        self.close_form()
        self.message.value = f"created {html.escape(wp.describe())}"
        self.refresh(force=True)
        self.on_change()
        return wp

    def _watch(self, abbr: str, nodes: Any, params: dict[str, Any]) -> Any:
        """Make the watchpoint: on the source, or ODD_RANK on the job (every rank; this rank's is returned)."""
        if abbr == "ODD_RANK" and self.job is not None:
            wps = self.job.watch(abbr, nodes, **params)
            mine = [wp for r, wp in wps.items() if self.job.source(r) is self.source.obj]
            if not mine and not wps:
                raise ValueError("ODD_RANK: the job has no ranks yet")
            return mine[0] if mine else next(iter(wps.values()))
        return self.source.watch(abbr, nodes, **params)

    def _show_error(self, text: str) -> None:
        """Put a message from the debugger under the field it is about (else under the form)."""
        m = _PARAM_RE.search(text)
        names = [m.group(1)] if m else [n for n in _NAMED_RE.findall(text) if n in self.fields]
        targets = [self.fields[n] for n in names if n in self.fields]
        if not targets or len(targets) > 2:  # e.g. "at least one parameter is needed": the form's
            self.form_error.value = _error_html(_in_words(text, self.fields))
            return
        for t in targets:
            t.error.value = _error_html(text)

    # -- list -------------------------------------------------------------------------------------
    def do_recheck(self) -> list[Any]:
        try:
            found = self.source.recheck()
        except Exception as e:  # noqa: BLE001 - shown to the user
            self.message.value = f"<span style='color:#cf222e'>recheck failed: {html.escape(str(e))}</span>"
            return []
        n = count_hits(found)
        self.message.value = f"recheck: {n} hit{'s' if n != 1 else ''} in the current step"
        self.on_change()
        return found

    def clear_all(self) -> None:
        self.source.unwatch(None)
        self.message.value = "all watchpoints deleted"
        self.refresh(force=True)
        self.on_change()

    def refresh(self, force: bool = False) -> None:
        wps = list(self.source.watchpoints.watchpoints.values())
        sel = self.selected()
        gv = self.source.graph.version
        sig = (tuple((p.id, p.version, p.enabled) for p in wps), sel, gv)
        if sig == self._sig and not force:
            return
        self._sig = sig
        node = self.source.graph.nodes.get(sel) if sel else None
        self.list.children = [self._row(p, node) for p in wps] or [w.HTML("<i>no watchpoints</i>")]

    def _count(self, wp: Any) -> int:
        key = (wp.id, wp.version, self.source.graph.version)
        n = self._counts.get(key)
        if n is None:
            n = self._counts[key] = sum(1 for node in list(self.source.graph.nodes.values())
                                                   if wp.selects(node))
        return n

    def _row(self, wp: Any, node: Any) -> w.HBox:
        enabled = w.Checkbox(value=wp.enabled, indent=False, layout=w.Layout(width="24px"), tooltip="enabled",
                             _dom_classes=("nbdebug-wp-enabled",))
        enabled.observe(lambda ch, wp=wp: self._set(wp, enabled=bool(ch["new"])), names="value")
        label = w.HTML(f"{html.escape(wp.describe())} <small>({self._count(wp)} nodes)</small>",
                       layout=w.Layout(flex="1 1 240px"),
                       _dom_classes=("nbdebug-wp-label",))  # beside its checkbox; the rest wraps below
        short = node.name if node is not None else "selected node"
        pick = w.Checkbox(value=bool(node is not None and wp.selects(node)), description=short, indent=False,
                          disabled=node is None, tooltip="watch the selected node with this watchpoint",
                          _dom_classes=("nbdebug-wp-node",))
        if node is not None:
            name = node.name
            pick.observe(lambda ch, wp=wp: self._set(wp, **({"add": name} if ch["new"] else {"remove": name})),
                         names="value")
        delete = _button(self._kit, "✕", "nbdebug-wp-delete", "delete this watchpoint")
        delete.on_click(lambda _b, wp=wp: self.delete(wp))
        row = w.HBox([enabled, label, pick, delete], layout=w.Layout(align_items="center", flex_flow="row wrap"),
                     _dom_classes=("nbdebug-wp-row", f"nbdebug-wp-{wp.id}"))
        return row

    def _set(self, wp: Any, **changes: Any) -> None:
        self.source.update_watch(wp, **changes)
        self.refresh(force=True)
        self.on_change()

    def delete(self, wp: Any) -> None:
        self.source.unwatch(wp)
        self.refresh(force=True)
        self.on_change()

    def rows(self) -> list[w.HBox]:
        return [r for r in self.list.children if isinstance(r, w.HBox)]


def _button(kit: Kit, text: str, css: str, tooltip: str, button_style: str = "") -> w.Button:
    return kit.button(text, tooltip, width="auto", classes=(css,), button_style=button_style)


def _in_words(text: str, names: Any) -> str:
    """``text`` with the form's parameter names in MindInsight's words ("choose from max >, min >")."""
    for n in sorted(names, key=len, reverse=True):
        text = re.sub(rf"\b{re.escape(n)}\b", label(n), text)
    return text


def _error_html(text: str) -> str:
    return f"<div style='color:#cf222e;white-space:normal;overflow-wrap:anywhere'>{html.escape(text)}</div>"


def _plain(markup: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", markup))
