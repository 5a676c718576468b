"""A real JupyterLab server and a real Chromium, for end-to-end tests (a pytest plugin).

One JupyterLab server (loopback only, temporary root dir, random token, isolated Jupyter config,
data, runtime and IPython dirs) and one headless Chromium (``/usr/bin/chromium`` via playwright) are
started once per pytest run and shared by every test that asks for them. The nbdebug lab extension
is served from its build output (``nbdebug/labextension``, when built) through ``JUPYTER_PATH``, so
the tests see exactly what the wheel ships without installing anything into the venv; tests of the
extension call :func:`labextension_build` to fail clearly when that build is missing or stale.

Use it from a test module::

    pytest_plugins = ["browser"]          # registers the fixtures once (shared session scope)

    def test_something(lab_page):
        lab_page.server.write_notebook("t.ipynb", ["x = 1", "print(x + 1)"])
        lab_page.open_notebook("t.ipynb")
        lab_page.run_all()
        lab_page.wait_for_output("2")
        lab_page.assert_not_blank(lab_page.screenshot("t"))

Fixtures
--------
``lab_server`` (session)  :class:`LabServer` — ``url``, ``token``, ``root``, ``env``,
    ``write_notebook(name, cells)``, ``jupyter(*args)`` (a ``jupyter`` CLI run in the server's
    environment), ``api(method, path)``, ``shutdown_kernels()``.
``chromium`` (session)    the playwright ``Browser``.
``notebook_server`` (session)  the same for Jupyter Notebook 7 (``jupyter notebook``): a
    :class:`LabServer` with ``app="notebook"``.
``nb_page`` (function)    a :class:`LabPage` on ``notebook_server`` (``open_notebook`` opens
    ``/notebooks/NAME``, Notebook 7's single-document page).
``lab_page`` (function)   :class:`LabPage`: a fresh browser context with JupyterLab loaded and
    ``window.jupyterapp`` exposed; ``open_notebook``, ``cells``, ``run_cell`` (one cell, waited for),
    ``run_all``, ``append_and_run``, ``wait_for_output``, ``wait_until`` (a JS predicate), ``command``,
    ``press``, ``screenshot``, ``assert_not_blank``; console errors collect in ``errors``. Its kernels are
    shut down after.

Screenshots go to ``tests/artifacts/`` (gitignored). Chromium is never downloaded: playwright drives
the system package (``apt-get install chromium``).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
LABEXTENSION_SRC = REPO / "labextension"
LABEXTENSION_BUILD = REPO / "nbdebug" / "labextension"
CHROMIUM = os.environ.get("NBDEBUG_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
SERVER_START_TIMEOUT = 120.0
PAGE_LOAD_TIMEOUT = 120_000  # ms; JupyterLab's first load on a busy 2-core machine is slow
# Plugins that would reach out to the internet or pop up toasts over the UI under test.
DISABLED_PLUGINS = ["@jupyterlab/apputils-extension:announcements"]


def labextension_build() -> Path:
    """The built lab extension; fails the test with what to run when it is missing or stale."""
    entry = list((LABEXTENSION_BUILD / "static").glob("remoteEntry.*.js"))
    if not (LABEXTENSION_BUILD / "package.json").is_file() or not entry:
        pytest.fail(f"the lab extension is not built ({LABEXTENSION_BUILD}); run `make` (or "
                    "`cd labextension && npm ci && npm run build`)", pytrace=False)
    sources = [*LABEXTENSION_SRC.glob("src/*.ts"), *LABEXTENSION_SRC.glob("schema/*.json"),
               *LABEXTENSION_SRC.glob("style/*"), LABEXTENSION_SRC / "package.json"]
    newest = max((p.stat().st_mtime for p in sources if p.exists()), default=0.0)
    built = (LABEXTENSION_BUILD / "package.json").stat().st_mtime
    if newest > built + 1:
        pytest.fail("the lab extension build is older than labextension/ sources; run `make` (or "
                    "`cd labextension && npm run build`)", pytrace=False)
    return LABEXTENSION_BUILD


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LabServer:
    """A JupyterLab server (``app="lab"``) or a Jupyter Notebook 7 server (``app="notebook"``) on
    127.0.0.1 with its own temporary root, token and Jupyter dirs."""

    def __init__(self, base: Path, app: str = "lab") -> None:
        if app not in ("lab", "notebook"):
            raise ValueError(f"app must be 'lab' or 'notebook', got {app!r}")
        self.app = app
        self.base = base
        self.root = base / "root"
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # one log per server (base: jupyterlab0, notebook70, ...) and pytest-xdist worker: never shared
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        self.log_path = ARTIFACTS / f"{base.name}{'-' + worker if worker else ''}-server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.env = self._environment()

    def _environment(self) -> dict[str, str]:
        data_path = self.base / "jupyter-path"
        (data_path / "labextensions").mkdir(parents=True)
        if (LABEXTENSION_BUILD / "package.json").is_file():  # tests of the extension check it is fresh
            (data_path / "labextensions" / "nbdebug").symlink_to(LABEXTENSION_BUILD, target_is_directory=True)
        config = self.base / "config"
        (config / "labconfig").mkdir(parents=True)
        (config / "labconfig" / "page_config.json").write_text(
            json.dumps({"disabledExtensions": {p: True for p in DISABLED_PLUGINS}}))
        for d in ("root", "data", "runtime", "ipython", "settings", "workspaces"):
            (self.base / d).mkdir(exist_ok=True)
        env = dict(os.environ)
        env.update({
            "JUPYTER_PATH": str(data_path),
            "JUPYTER_CONFIG_DIR": str(config),
            "JUPYTER_DATA_DIR": str(self.base / "data"),
            "JUPYTER_RUNTIME_DIR": str(self.base / "runtime"),
            "JUPYTERLAB_SETTINGS_DIR": str(self.base / "settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(self.base / "workspaces"),
            "IPYTHONDIR": str(self.base / "ipython"),
            "JUPYTER_PLATFORM_DIRS": "1",
            "PYTHONUNBUFFERED": "1",
            # the kernel imports this checkout's nbdebug (also from a git worktree), not the venv's copy
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        })
        env.pop("JUPYTER_TOKEN", None)
        return env

    def start(self) -> None:
        ARTIFACTS.mkdir(exist_ok=True)
        cmd = [sys.executable, "-m", "jupyterlab" if self.app == "lab" else "notebook", "--no-browser",
               "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}"]
        if self.app == "lab":
            cmd += ["--LabApp.expose_app_in_browser=True",
                    "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                    "--LabApp.news_url=None", "--LabApp.extension_manager=readonly"]
        else:
            cmd += ["--JupyterNotebookApp.expose_app_in_browser=True"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")  # containers and CI runners
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.root)
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.api("GET", "/api/status")
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.3)
        raise RuntimeError(f"JupyterLab did not answer within {SERVER_START_TIMEOUT:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.shutdown_kernels()
        except Exception:
            pass
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def api(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        """Call the server's REST API; returns the decoded JSON (or None)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback only
            raw = resp.read()
        return json.loads(raw) if raw else None

    def shutdown_kernels(self) -> None:
        for kernel in self.api("GET", "/api/kernels") or []:
            try:
                self.api("DELETE", f"/api/kernels/{kernel['id']}", timeout=30)
            except urllib.error.HTTPError:
                pass

    def write_notebook(self, name: str, cells: Sequence[str | tuple[str, str]]) -> Path:
        """Write a notebook into the root dir; a cell is code, or ``("markdown", text)``."""
        import nbformat

        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        for cell in cells:
            if isinstance(cell, tuple):
                kind, text = cell
                nb.cells.append(nbformat.v4.new_markdown_cell(text) if kind == "markdown"
                                else nbformat.v4.new_code_cell(text))
            else:
                nb.cells.append(nbformat.v4.new_code_cell(cell))
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path)
        return path

    def jupyter(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run ``jupyter ARGS`` in the server's environment (same JUPYTER_PATH and config)."""
        exe = shutil.which("jupyter", path=str(Path(sys.executable).parent)) or "jupyter"
        return subprocess.run([exe, *args], env=self.env, capture_output=True, text=True, timeout=timeout,
                              check=False)


class LabPage:
    """One browser context + page with JupyterLab loaded."""

    def __init__(self, server: LabServer, browser: Any, name: str) -> None:
        self.server = server
        self.name = name
        self.context = browser.new_context(viewport={"width": 1440, "height": 900})
        self.page = self.context.new_page()
        self.page.set_default_timeout(30_000)
        self.errors: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        self.page.on("console", self._on_console)

    def _on_console(self, msg: Any) -> None:
        if msg.type == "error":
            self.errors.append(f"console: {msg.text}")

    # -- navigation -------------------------------------------------------------------------------
    def goto(self, path: str = "lab") -> None:
        """Open ``/path`` (workspace reset) and wait until JupyterLab has restored its layout."""
        sep = "&" if "?" in path else "?"
        self.page.goto(f"{self.server.url}/{path}{sep}reset&token={self.server.token}",
                       timeout=PAGE_LOAD_TIMEOUT)
        self.page.wait_for_function("() => window.jupyterapp !== undefined", timeout=PAGE_LOAD_TIMEOUT)
        self.page.evaluate("() => window.jupyterapp.restored")

    def open_notebook(self, name: str, kernel_timeout: float = 120.0) -> None:
        """Open ``name`` (relative to the server root) and wait for its kernel to be idle."""
        self.goto(f"lab/tree/{name}" if self.server.app == "lab" else f"notebooks/{name}")
        self.page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=PAGE_LOAD_TIMEOUT)
        self.wait_until("""() => {
            const w = window.jupyterapp.shell.currentWidget;
            const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
            return !!k && k.status === 'idle' && k.connectionStatus === 'connected';
        }""", timeout=kernel_timeout)

    # -- acting -----------------------------------------------------------------------------------
    def command(self, command_id: str, args: dict[str, Any] | None = None) -> Any:
        """Execute a JupyterLab command (as the menu or palette would)."""
        return self.page.evaluate("([id, args]) => window.jupyterapp.commands.execute(id, args)",
                                  [command_id, args or {}])

    def run_all(self) -> None:
        self.command("notebook:run-all-cells")

    def cells(self) -> list[tuple[str, str]]:
        """``(cell_type, source)`` of each cell of the current notebook."""
        return [tuple(c) for c in self.page.evaluate("""() => {
            const cells = window.jupyterapp.shell.currentWidget.content.model.cells;
            return Array.from({length: cells.length}, (_, i) => cells.get(i))
                .map(c => [c.type, c.sharedModel.getSource()]);
        }""")]

    def run_cell(self, index: int, timeout: float = 120.0) -> None:
        """Run cell ``index`` of the current notebook and wait until it has finished.

        Fails with the cell's outputs when it raised, and with a clear message when it took longer
        than ``timeout`` seconds."""
        result = self.page.evaluate("""async ([index, ms]) => {
            const panel = window.jupyterapp.shell.currentWidget;
            panel.content.activeCellIndex = index;
            panel.content.deselectAll();
            const run = window.jupyterapp.commands.execute('notebook:run-cell');
            const timer = new Promise(resolve => setTimeout(() => resolve('timeout'), ms));
            return await Promise.race([run.then(ok => ok === false ? 'error' : 'ok'), timer]);
        }""", [index, int(timeout * 1000)])
        if result == "ok":
            return
        outputs = self.page.evaluate("""(index) => {
            const cell = window.jupyterapp.shell.currentWidget.content.widgets[index];
            return cell.node.querySelector('.jp-OutputArea')?.textContent ?? '';
        }""", index)
        what = f"did not finish within {timeout:.0f} s" if result == "timeout" else "raised"
        raise AssertionError(f"cell {index} {what}; its output:\n{outputs[-3000:]}")

    def append_and_run(self, code: str) -> None:
        """Add a code cell at the end of the current notebook and run it (returns at once)."""
        self.page.evaluate("""async (code) => {
            const panel = window.jupyterapp.shell.currentWidget;
            const n = panel.content.model.cells.length;
            panel.content.model.sharedModel.insertCell(n, {cell_type: 'code', source: code});
            panel.content.activeCellIndex = n;
            void window.jupyterapp.commands.execute('notebook:run-cell');
        }""", code)

    def focus_notebook(self) -> None:
        """Command mode on the current notebook, so keyboard shortcuts reach it."""
        self.page.locator(".jp-NotebookPanel .jp-Notebook").first.click(position={"x": 5, "y": 5})
        self.page.keyboard.press("Escape")

    def press(self, keys: str) -> None:
        """Press a key chord on the page, e.g. ``"Alt+Shift+P"``."""
        self.page.keyboard.press(keys)

    # -- waiting ----------------------------------------------------------------------------------
    def wait_until(self, predicate_js: str, timeout: float = 30.0, arg: Any = None) -> Any:
        """Wait until the JS function ``predicate_js`` returns something truthy; returns it. On a timeout the
        assertion carries the page's errors and the server log's tail (what a failure in CI needs)."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        try:
            handle = self.page.wait_for_function(predicate_js, arg=arg, timeout=timeout * 1000, polling=200)
        except PlaywrightTimeout as e:
            raise AssertionError(f"{e}\nwaiting for: {predicate_js[:300]}\npage errors: {self.errors[-10:]}\n"
                                 f"server log tail:\n{self.server.log_tail(40)}") from None
        return handle.json_value()

    def wait_for_output(self, text: str, timeout: float = 60.0) -> None:
        """Wait until some cell output of the current notebook contains ``text``."""
        self.wait_until("""(text) => Array.from(document.querySelectorAll(
                '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output'))
                .some(e => e.textContent.includes(text))""", timeout=timeout, arg=text)

    def outputs(self) -> list[str]:
        return self.page.evaluate("""() => Array.from(document.querySelectorAll(
            '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output')).map(e => e.textContent)""")

    # -- evidence ---------------------------------------------------------------------------------
    def screenshot(self, name: str, selector: str | None = None) -> Path:
        """Save a PNG of the page (or of ``selector``) to tests/artifacts/NAME.png; returns the path."""
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        if selector is None:
            self.page.screenshot(path=str(path))
        else:
            self.page.locator(selector).first.screenshot(path=str(path))
        return path

    @staticmethod
    def assert_not_blank(path: Path, min_stddev: float = 6.0, min_colors: int = 8) -> None:
        """Fail when the image is (nearly) one flat colour: a blank or unrendered page."""
        from PIL import Image, ImageStat

        with Image.open(path) as img:
            rgb = img.convert("RGB")
            colors = rgb.getcolors(maxcolors=1 << 16)
            n_colors = len(colors) if colors is not None else 1 << 16
            stddev = ImageStat.Stat(rgb.convert("L")).stddev[0]
        assert n_colors >= min_colors and stddev >= min_stddev, (
            f"{path.name} looks blank: {n_colors} colours, grey-level stddev {stddev:.1f}")

    def close(self) -> None:
        try:
            self.context.close()
        finally:
            self.server.shutdown_kernels()


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    server = LabServer(tmp_path_factory.mktemp("jupyterlab"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def notebook_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    server = LabServer(tmp_path_factory.mktemp("notebook7"), app="notebook")
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install the Debian package `chromium` (make test does)",
                    pytrace=False)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def _page(server: LabServer, browser: Any, request: pytest.FixtureRequest) -> Iterator[LabPage]:
    """A fresh page on ``server``; a screenshot of it when the test failed; its kernels shut down after."""
    page = LabPage(server, browser, request.node.name)
    try:
        yield page
    finally:
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            try:
                page.screenshot(f"FAILED-{request.node.name}")
            except Exception:
                pass
        page.close()


@pytest.fixture
def built_extension() -> Path:
    """Fail with what to run when nbdebug/labextension is missing or older than its sources (a module that
    needs the lab extension says ``pytestmark = pytest.mark.usefixtures("built_extension")``)."""
    return labextension_build()


@pytest.fixture
def lab_page(lab_server: LabServer, chromium: Any, request: pytest.FixtureRequest) -> Iterator[LabPage]:
    yield from _page(lab_server, chromium, request)


@pytest.fixture
def nb_page(notebook_server: LabServer, chromium: Any, request: pytest.FixtureRequest) -> Iterator[LabPage]:
    yield from _page(notebook_server, chromium, request)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keep each phase's report on the item, so ``lab_page`` can screenshot failures."""
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep
