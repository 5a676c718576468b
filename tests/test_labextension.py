"""The JupyterLab extension in a real JupyterLab, driven through real Chromium.

One notebook trains a tiny torch model under ``dbg.run(..., paused=True)`` with a TO (tensor
overflow) watchpoint on a probe module that sees an injected NaN in step 2. The test then uses only
the UI: the toolbar's continue button (runs into the hit), the status item (paused, step, hits), the
pause shortcut (while a cell keeps the kernel's main shell busy, so it must travel on a subshell),
and the command palette (terminate).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from browser import LabPage, LabServer




pytestmark = pytest.mark.usefixtures("built_extension")  # tests/browser.py


REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "labextension" / "schema" / "plugin.json"
COMMANDS = ["continue", "step", "next-node", "pause", "terminate"]
STATUS = "#jp-main-statusbar .nbdebug-StatusItem"

NOTEBOOK = [
    """\
import time, torch, nbdebug

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 1)
        self.probe = torch.nn.Identity()   # sees a NaN in step 2 only; the loss never does

    def forward(self, x, bad=False):
        self.probe(torch.full((2,), float("nan")) if bad else torch.zeros(2))
        return self.fc2(torch.relu(self.fc1(x)))

torch.manual_seed(0)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def train(steps=3000):
    for i in range(steps):
        loss = model(torch.randn(8, 4), bad=(i == 2)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.02)""",
    """\
dbg = nbdebug.Debugger(model)
dbg.watch("TO", nodes="Module.probe.*")
dbg.run(train, paused=True)
print("started", dbg.state)""",
]


def strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def shortcut_keys(schema: dict) -> list[tuple[str, str, str]]:
    """(command, key sequence, selector) of each shortcut a plugin schema declares."""
    return [(s["command"], ", ".join(s["keys"]), s.get("selector", ""))
            for s in schema.get("jupyter.lab.shortcuts", [])]


def normalize(keys: str) -> str:
    """A key sequence with each chord's modifiers sorted and ``Accel`` as ``Ctrl`` (Linux/Windows)."""
    mods = ("Alt", "Ctrl", "Shift", "Cmd", "Meta")
    chords = []
    for chord in keys.split(", "):
        parts = chord.replace("Accel", "Ctrl").split()
        chords.append(" ".join(sorted(p for p in parts if p in mods) + [p.upper() for p in parts if p not in mods]))
    return ", ".join(chords)


def test_extension_is_listed_enabled(lab_server: LabServer) -> None:
    result = lab_server.jupyter("labextension", "list")
    listing = strip_ansi(result.stdout + result.stderr)
    assert result.returncode == 0, listing
    version = json.loads((REPO / "labextension" / "package.json").read_text())["version"]
    assert re.search(rf"^\s*nbdebug v{re.escape(version)} enabled OK", listing, re.M), listing


def test_shortcuts_do_not_clash_with_jupyterlab_defaults(lab_server: LabServer) -> None:
    ours = shortcut_keys(json.loads(SCHEMA.read_text()))
    assert sorted(c for c, _, _ in ours) == sorted(f"nbdebug:{c}" for c in COMMANDS)
    # Every shortcut JupyterLab and the installed extensions define by default.
    from jupyterlab.commands import get_app_dir

    data_dirs = json.loads(lab_server.jupyter("--paths", "--json").stdout)["data"]
    roots = [Path(get_app_dir()) / "schemas"] + [Path(d) / "labextensions" for d in data_dirs]
    taken: dict[str, str] = {}
    for root in roots:
        for path in root.rglob("*.json"):
            if "nbdebug" in path.parts:
                continue
            try:
                schema = json.loads(path.read_text())
            except (ValueError, OSError):
                continue
            if not isinstance(schema, dict):
                continue
            for command, keys, _selector in shortcut_keys(schema):
                taken[normalize(keys)] = command
    assert len(taken) > 100, "JupyterLab's default shortcuts were not found"
    clashes = {keys: taken[normalize(keys)] for _, keys, _ in ours if normalize(keys) in taken}
    assert not clashes, f"nbdebug shortcuts clash with JupyterLab defaults: {clashes}"
    # The JupyterLab debugger's F9/F10/F11 family stays free too.
    assert not any(re.search(r"\bF\d+\b", keys) for _, keys, _ in ours)


def status(lab: LabPage) -> dict:
    return lab.page.evaluate(f"""() => {{
        const e = document.querySelector('{STATUS}');
        return e ? {{state: e.dataset.state, text: e.textContent, title: e.title,
                     visible: e.offsetParent !== null}} : null;
    }}""")


def wait_state(lab: LabPage, state: str, text: str | None = None, timeout: float = 60.0) -> dict:
    lab.wait_until("""([sel, state, text]) => {
        const e = document.querySelector(sel);
        return e && e.offsetParent !== null && e.dataset.state === state
               && (text === null || new RegExp(text).test(e.textContent));
    }""", timeout=timeout, arg=[STATUS, state, text])
    return status(lab)


def buttons(lab: LabPage) -> dict[str, str]:
    """Each nbdebug toolbar button of the current notebook: 'enabled', 'disabled' or 'hidden'."""
    return lab.page.evaluate("""(names) => {
        const out = {};
        const panel = window.jupyterapp.shell.currentWidget.node;
        for (const name of names) {
            const b = panel.querySelector(`.jp-Toolbar [data-command="nbdebug:${name}"]`);
            out[name] = !b ? 'missing' : b.offsetParent === null ? 'hidden' : b.disabled ? 'disabled' : 'enabled';
        }
        return out;
    }""", COMMANDS)


def click(lab: LabPage, name: str) -> None:
    lab.page.locator(f'.jp-NotebookPanel .jp-Toolbar [data-command="nbdebug:{name}"]').first.click()


def test_toolbar_status_item_and_shortcuts_control_training(lab_page: LabPage) -> None:
    lab = lab_page
    lab.server.write_notebook("train.ipynb", NOTEBOOK)
    lab.open_notebook("train.ipynb")

    # The extension is in the page and active.
    config = json.loads(lab.page.locator("#jupyter-config-data").text_content())
    assert "nbdebug" in [e["name"] for e in config["federated_extensions"]]
    assert lab.page.evaluate("() => window.jupyterapp.isPluginActivated('nbdebug:plugin')")
    # Our shortcuts are live, and no other live binding uses the same keys.
    bindings = lab.page.evaluate("""() => window.jupyterapp.commands.keyBindings.map(
        b => ({command: b.command, keys: b.keys.join(', '), selector: b.selector}))""")
    ours = {b["keys"]: b["command"] for b in bindings if b["command"].startswith("nbdebug:")}
    assert sorted(ours.values()) == sorted(f"nbdebug:{c}" for c in COMMANDS)
    assert ours["Alt Shift P"] == "nbdebug:pause"
    assert not [b for b in bindings if b["keys"] in ours and not b["command"].startswith("nbdebug:")]
    # Before any debugger: no status item, toolbar buttons hidden, commands disabled.
    assert (status(lab) or {}).get("visible") is not True
    assert set(buttons(lab).values()) == {"hidden"}

    lab.run_all()
    lab.wait_for_output("started paused")
    first = wait_state(lab, "paused", r"step 0 next · 0 hits")
    assert first["text"] == "nbdebug: paused · step 0 next · 0 hits"
    assert buttons(lab) == {"continue": "enabled", "step": "enabled", "next-node": "enabled",
                            "pause": "disabled", "terminate": "enabled"}

    # Continue (toolbar) runs into the TO hit on the probe in step 2.
    click(lab, "continue")
    hit = wait_state(lab, "paused", r"· [1-9]\d* hits?$")
    # the step of the hits (as in the panel's header and pause reason), then the step that runs next
    assert re.fullmatch(r"nbdebug: paused · step 2 · step 3 next · [1-9]\d* hits?", hit["text"]), hit
    assert "watchpoint hit" in hit["title"]
    shot = lab.screenshot("labextension-paused-after-hit")
    lab.assert_not_blank(shot)
    lab.assert_not_blank(lab.screenshot("labextension-statusbar", "#jp-main-statusbar"), min_colors=4)

    # Continue again: training runs on; only pause and terminate apply.
    click(lab, "continue")
    wait_state(lab, "running")
    lab.wait_until("""() => {
        const q = n => document.querySelector('.jp-NotebookPanel .jp-Toolbar [data-command="nbdebug:' + n + '"]');
        return q('continue').disabled && !q('pause').disabled;
    }""")
    assert buttons(lab) == {"continue": "disabled", "step": "disabled", "next-node": "disabled",
                            "pause": "enabled", "terminate": "enabled"}

    # Keep the main shell busy, then pause with the shortcut: it must arrive on a subshell.
    lab.append_and_run("print('waited:', dbg.wait(120))")
    lab.wait_until("""() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'busy'""")
    lab.focus_notebook()
    lab.press("Alt+Shift+P")
    paused = wait_state(lab, "paused", timeout=30)
    assert "paused" in paused["title"]
    lab.wait_for_output("waited: paused", timeout=30)
    assert buttons(lab)["continue"] == "enabled"
    lab.assert_not_blank(lab.screenshot("labextension-paused-by-shortcut"))

    # Terminate from the command palette.
    lab.command("apputils:activate-command-palette")
    lab.page.keyboard.type("Terminate Training")
    item = lab.page.locator(".lm-CommandPalette-item", has_text="Terminate Training").first
    item.wait_for()
    assert "nbdebug" in item.locator("xpath=preceding-sibling::li[contains(@class,'lm-CommandPalette-header')][1]")\
        .text_content().lower()
    lab.page.keyboard.press("Enter")
    done = wait_state(lab, "terminated")
    assert done["text"].startswith("nbdebug: terminated")
    assert set(buttons(lab).values()) == {"disabled"}

    # A reloaded page finds the kernel's open status comm again.
    lab.open_notebook("train.ipynb")
    assert wait_state(lab, "terminated")["text"] == done["text"]

    nbdebug_errors = [e for e in lab.errors if "nbdebug" in e.lower()]
    assert not nbdebug_errors, nbdebug_errors
