"""The hit list in real JupyterLab + Chromium: one widget draws the shown page of groups and its pager
(``frontend/src/hits.ts``); its buttons act in the kernel as the old per-row widgets did.

A NaN weight in the first of six linear layers makes every later tensor non-finite: more than a page of
groups (node · condition). In the browser: the pager's next page, a row's select button (the node is
selected: node details), its View button (the tensor view on the hit's tensor); the kernel's hit list
agrees with what the page shows.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from browser import LabPage

PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden) .nbdebug-panel"

SETUP = """\
import torch, torch.nn as nn, nbdebug
torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(6)])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
dbg = nbdebug.Debugger(model, level="mix")
dbg.watch("TO")
with torch.no_grad():
    model[0].weight[0, 0] = float("nan")
def train(steps):
    for _ in range(steps):
        opt.zero_grad(); model(torch.randn(2, 4)).sum().backward(); opt.step()
dbg.run(train, 2)
while dbg.wait(120).value == "paused":
    dbg.cont()
p = dbg.panel(); p
"""

# what the page's hit list shows: title, pager label, group titles, rows per group
SHOWN = """(sel) => {
    const p = document.querySelector(sel);
    if (!p) return null;
    const t = c => { const e = p.querySelector(c); return e ? e.textContent.trim() : null; };
    const pager = p.querySelector('.nbdebug-hit-pager');
    return {title: t('.nbdebug-hit-title'), count: t('.nbdebug-hit-count'),
            pager: pager && getComputedStyle(pager).display !== 'none' ? pager.textContent.trim() : null,
            groups: Array.from(p.querySelectorAll('.nbdebug-hit-group-title')).map(e => e.textContent.trim()),
            rows: Array.from(p.querySelectorAll('.nbdebug-hit-group'))
                .map(g => g.querySelectorAll('.nbdebug-hit-row').length)};
}"""


def kernel(lab: LabPage, code: str) -> str:
    """Run ``code`` in a new cell; its printed output."""
    n = len(lab.cells())
    lab.append_and_run(code)
    lab.wait_until("(n) => window.jupyterapp.shell.currentWidget.content.widgets.length > n "
                   "&& !!window.jupyterapp.shell.currentWidget.content.widgets[n].node"
                   ".querySelector('.jp-OutputArea-output')", arg=n, timeout=60)
    return lab.page.evaluate("""(n) => window.jupyterapp.shell.currentWidget.content.widgets[n]
        .node.querySelector('.jp-OutputArea').textContent""", n).strip()


def test_hit_list_pages_selects_and_views_in_the_browser(lab_page: LabPage) -> None:
    lab = lab_page
    lab.page.set_viewport_size({"width": 1440, "height": 2000})
    lab.server.write_notebook("hits.ipynb", [SETUP])
    lab.open_notebook("hits.ipynb")
    lab.run_cell(0, timeout=300)
    shown = lab.wait_until(f"(sel) => {{ const s = ({SHOWN})(sel); return s && s.pager && s.groups.length === 10 "
                           "&& s.title === `Hits (${s.count})` ? s : null; }", arg=PANEL, timeout=120)
    m = re.fullmatch(r"‹\s*groups 1–10 of (\d+) \(node · condition\)\s*›", shown["pager"])
    assert m and int(m.group(1)) > 10, shown
    assert all(1 <= r <= 2 for r in shown["rows"]), shown
    panel = lab.page.locator(PANEL).first

    # the pager's next page: the kernel pages, the page shows groups 11–…
    panel.locator(".nbdebug-hit-pager button").last.click()
    page2 = lab.wait_until(f"(sel) => {{ const s = ({SHOWN})(sel); return s && s.pager.includes('groups 11–') "
                           "? s : null; }", arg=PANEL)
    assert not set(page2["groups"]) & set(shown["groups"]), (shown, page2)

    # a row's select button selects its node (node details name it); the group's title names that node
    group = panel.locator(".nbdebug-hit-group").first
    node = group.locator(".nbdebug-hit-group-title b").inner_text().strip()
    group.locator("button.nbdebug-hit-select").first.click()
    lab.wait_until("""([sel, name]) => { const t = document.querySelector(sel + ' .nbdebug-details-title');
        return t && t.textContent.includes(name); }""", arg=[PANEL, node])

    # its View button opens the tensor view on the hit's tensor
    group.locator("button.nbdebug-hit-view").first.click()
    lab.wait_until("""([sel, name]) => { const t = document.querySelector(sel + ' .nbdebug-tensor-title');
        return t && t.textContent.includes(name); }""", arg=[PANEL, node], timeout=60)

    # the kernel agrees: second page, that node selected, the same groups listed
    out = kernel(lab, "print(p.hit_list.page, p.selected, p.tensor_view.node, "
                      "[g.key[0] for g in p.hit_list.groups()][0])")
    assert out.split() == ["1", node, node, node], out
    assert lab.errors == [], lab.errors
