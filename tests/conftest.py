"""Shared test set-up: the test tiers (markers), the browser plugin, and the small torch models (loaded lazily).

Tiers: ``browser`` (drives Chromium through tests/browser.py), ``subprocess`` (starts processes: kernels,
torchrun, scripts, JupyterLab), ``slow`` (a module that takes ~20 s or more). ``make test-fast`` runs what
carries none of them. Each test module says its tiers with a module-level ``pytestmark``; a module that
uses the browser fixtures or starts processes without saying so is marked here all the same, so the fast
tier never picks up a slow one by omission.
"""

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

#: scripts the remote tests start as processes (they read sys.argv at import): not test modules
collect_ignore_glob = ["remote_scripts/*"]

pytest_plugins = ["browser"]  # one JupyterLab server and one Chromium for every browser test (tests/browser.py)

TIERS = {
    "browser": "drives Chromium (tests/browser.py fixtures); needs the browser and JupyterLab",
    "subprocess": "starts processes: kernels, torchrun/msrun, scripts, JupyterLab, pip",
    "slow": "a module that takes ~20 s or more on a 2-core machine",
}
#: not a tier: what the numpy-2 run of ``make test`` (tests/torch_only.py) leaves to the main run
OWN_ENVIRONMENT = ("own_environment: builds the environment it checks (a fresh venv from the base interpreter) and "
                   "uses nothing of the one pytest runs in; the numpy-2 run does not repeat it")
#: fixtures of tests/browser.py: a test using one is a browser test
BROWSER_FIXTURES = frozenset({"lab_page", "nb_page", "chromium", "lab_server", "notebook_server",
                              "built_extension"})
#: what in a test module's source starts a process
STARTS_PROCESS = re.compile(r"subprocess\.(run|Popen|check_call|check_output)|Popen\(|KernelManager\(|"
                            r"NotebookClient\(|multiprocessing|"
                            r"from (remote_procs|msprobe_runs|interchange_runs) import")


def pytest_configure(config):
    for name, what in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")
    config.addinivalue_line("markers", OWN_ENVIRONMENT)
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
        # the controller of a pytest-xdist run, before its workers start (they inherit the environment):
        # the msProbe dumps of tests/msprobe_runs.py go to one folder, made once whichever worker asks first
        folder = tempfile.mkdtemp(prefix="nbdebug-msprobe-")
        os.environ["NBDEBUG_MSPROBE_RUNS"] = folder
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


def _starts_process(path: Path, cache: dict = {}) -> bool:  # noqa: B006 - a per-session cache
    if path not in cache:
        try:
            cache[path] = bool(STARTS_PROCESS.search(path.read_text(encoding="utf-8")))
        except OSError:
            cache[path] = False
    return cache[path]


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not str(item.fspath).endswith(".py") or not Path(str(item.fspath)).name.startswith("test_"):
            continue
        if BROWSER_FIXTURES & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.browser)
        if not item.get_closest_marker("subprocess") and _starts_process(Path(str(item.fspath))):
            item.add_marker(pytest.mark.subprocess)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the longest modules first (see below)
        items.sort(key=_worker_rank)  # stable: a module's tests keep their order


# -- pytest-xdist (make test: `-n N --dist loadfile`) --------------------------------------------------------
# One work unit per module (its module-scoped fixtures are set up once), except that every module on the
# shared servers of tests/browser.py is one unit: the run starts one JupyterLab and one Notebook 7 server, as
# it does without xdist. Units go out in the workers' collection order, which puts the longest first (the
# servers' unit, slow, subprocess, browser, the rest), so the last units to finish are short ones.
# (pytest-xdist 3.8's `xdist_group` marks do not work on pytest 9: they rename `item._nodeid`, which pytest 9
# no longer reads; hence a scheduler of our own.)

#: the session-scoped servers of tests/browser.py (a module on Chromium alone may run in any worker: that
#: worker starts its own Chromium, a few seconds)
SHARED_SERVERS = re.compile(r"\b(lab_page|nb_page|lab_server|notebook_server)\b")
SERVERS_UNIT = "tests/browser.py servers"


def _on_shared_servers(path: Path, cache: dict = {}) -> bool:  # noqa: B006 - a per-session cache
    if path not in cache:
        try:
            cache[path] = path.name.startswith("test_") and bool(SHARED_SERVERS.search(path.read_text("utf-8")))
        except OSError:
            cache[path] = False
    return cache[path]


def _worker_rank(item) -> int:
    if _on_shared_servers(Path(str(item.fspath))):
        return 0
    return next((i for i, tier in enumerate(("slow", "subprocess", "browser"), 1) if item.get_closest_marker(tier)),
                4)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        """``--dist loadfile``, with the modules on the shared servers in one unit, in collection order."""

        def __init__(self, config, log=None) -> None:
            super().__init__(config, log)
            config.option.loadscopereorder = False  # keep the workers' order: longest units first

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return SERVERS_UNIT if _on_shared_servers(config.rootpath / path) else path

    return ModuleScheduling(config, log)


def _define_torch_models() -> None:
    """Define ``Block``, ``Net`` and ``train_steps`` here (module globals of conftest, as before) on first use."""
    import torch
    import torch.nn as nn

    class Block(nn.Module):
        """A reused Linear and a residual add."""

        def __init__(self, d: int = 16) -> None:
            super().__init__()
            self.lin = nn.Linear(d, d)

        def forward(self, x):
            return self.lin(self.lin(x)) + x

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(8, 16)
            self.act = nn.ReLU()
            self.block = Block()
            self.fc2 = nn.Linear(16, 4)

        def forward(self, x):
            x = self.fc1(x)
            x.add_(1.0)  # in-place op on an activation
            x = self.act(x)
            return self.fc2(self.block(x))

    def train_steps(model, steps=2, dbg=None, batch=5, lr=0.1, seed=0):
        g = torch.Generator().manual_seed(seed)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        losses = []
        for _ in range(steps):
            x = torch.randn(batch, 8, generator=g)
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), torch.zeros(batch, 4))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return opt, losses

    for obj in (Block, Net, train_steps):  # importable (and picklable) as conftest.<name>
        obj.__qualname__ = obj.__name__
        globals()[obj.__name__] = obj


def __getattr__(name):
    """``from conftest import Net, Block, train_steps``: torch is imported only by the tests that ask."""
    if name in ("Block", "Net", "train_steps"):
        _define_torch_models()
        return globals()[name]
    raise AttributeError(f"module 'conftest' has no attribute {name!r}")


@pytest.fixture
def net():
    import torch

    torch.manual_seed(0)
    return __getattr__("Net")()
