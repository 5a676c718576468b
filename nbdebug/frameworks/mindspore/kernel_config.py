"""MindSpore's kernel dump armed: its JSON config (every run, or every k-th: sampled capture), written
before the first graph compile of the process and named by ``MINDSPORE_DUMP_CONFIG``, in ``/dev/shm`` when it
has room.

>>> cfg = dump_config("/tmp/dump")
>>> cfg["common_dump_settings"]["iteration"], cfg["e2e_dump_settings"]["enable"]
('all', True)
>>> sampled_iterations(5, captures=3)
'0|5|10'
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import threading
from typing import Any

NET_NAME = "Net"
ENV = "MINDSPORE_DUMP_CONFIG"


# -- the dump config --------------------------------------------------------------------------------

def dump_config(path: str, net_name: str = NET_NAME) -> dict[str, Any]:
    """MindSpore's e2e kernel dump settings: every kernel's inputs and outputs, every iteration."""
    return {
        "common_dump_settings": {
            "dump_mode": 0, "path": path, "net_name": net_name, "iteration": "all", "saved_data": "tensor",
            "input_output": 0, "kernels": [], "support_device": [0, 1, 2, 3, 4, 5, 6, 7],
        },
        "e2e_dump_settings": {"enable": True, "trans_flag": True},
    }


#: how many runs a sampled dump (``graph_every=k``) captures: MindSpore's ``iteration`` field has no
#: "every k-th" form, so the captured iterations are listed (``0|k|2k|…``), and MindSpore scans that list
#: for every run: a longer one slows every step (on CPU, 400 entries cost about as much as a small plain
#: step; 100 a sixth of it)
SAMPLED_CAPTURES = 100


def sampled_iterations(every: int, captures: int = SAMPLED_CAPTURES) -> str:
    """MindSpore's dump ``iteration`` value for every ``every``-th run, ``captures`` of them.

    >>> sampled_iterations(5, 4)
    '0|5|10|15'
    """
    return "|".join(str(i * every) for i in range(captures))


def check_every(every: Any) -> int:
    """``graph_every`` as an int ≥ 1, or a ``ValueError`` saying what is accepted."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"graph_every must be an int >= 1 (capture every k-th graph run), got {every!r}")
    return every


_ARMED: dict[str, Any] = {}
_ARM_LOCK = threading.Lock()




def arm_kernel_dump(every: int = 1) -> str:
    """Point ``MINDSPORE_DUMP_CONFIG`` at a config nbdebug owns (once per process); returns the dump root.

    MindSpore reads the variable when it compiles the first graph of the process and never again, so
    this must run before any GRAPH-mode compile (creating a GRAPH-mode ``Debugger`` does it). The
    directory is a private temporary one, emptied when debuggers close and removed at exit. ``every``
    > 1 has MindSpore dump only every ``every``-th run of each graph (:func:`sampled_iterations`); it is
    fixed for the process by the first call, and a later call asking for another value is an error.
    """
    every = check_every(every)
    with _ARM_LOCK:
        if "root" in _ARMED:
            if _ARMED["every"] != every:
                raise RuntimeError(
                    f"MindSpore's kernel dump of this process was armed with graph_every={_ARMED['every']}; "
                    f"it reads its dump configuration once per process, so graph_every={every} cannot take "
                    f"effect. Use graph_every={_ARMED['every']}, or restart the kernel and create this "
                    f"Debugger first")
            return _ARMED["root"]
        current = os.environ.get(ENV)
        inherited = bool(current) and os.path.basename(os.path.dirname(current)).startswith("nbdebug-msdump-")
        if current and not inherited:  # (an nbdebug parent process's config is replaced by our own)
            raise RuntimeError(
                f"{ENV} is already set to {current!r}; in GRAPH mode nbdebug drives MindSpore's kernel dump "
                f"itself. Unset the variable (and restart the kernel), or open that dump offline with "
                f"nbdebug.load(<its path>)")
        root = tempfile.mkdtemp(prefix="nbdebug-msdump-", dir=dump_parent())
        cfg_path = os.path.join(root, "dump_config.json")
        cfg = dump_config(os.path.join(root, "dump"))
        if every > 1:
            cfg["common_dump_settings"]["iteration"] = sampled_iterations(every)
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        os.environ[ENV] = cfg_path
        _ARMED.update(root=root, dump=os.path.join(root, "dump"), config=cfg_path, every=every)
        atexit.register(shutil.rmtree, root, True)
        return root


#: free space a memory file system must have to hold the dump (two steps of tensors stay on it)
SHM_MIN_FREE = 1 << 30
SHM = "/dev/shm"


def dump_parent() -> str | None:
    """Where the dump directory goes: ``/dev/shm`` (memory) when it exists, is writable and has
    :data:`SHM_MIN_FREE` bytes free — MindSpore writes every tensor of every step, and on a disk that
    write is about half the dump's cost — else the system's temporary directory (None).
    ``NBDEBUG_DUMP_PARENT`` overrides both."""
    chosen = os.environ.get("NBDEBUG_DUMP_PARENT")
    if chosen:
        return chosen
    try:
        st = os.statvfs(SHM)
    except OSError:
        return None
    return SHM if os.access(SHM, os.W_OK) and st.f_bavail * st.f_frsize >= SHM_MIN_FREE else None


def armed_config() -> str | None:
    """The path of the dump config this process armed (None: not armed)."""
    return _ARMED.get("config")


def armed_dump_dir() -> str | None:
    """Where MindSpore writes the armed kernel dump (None before :func:`arm_kernel_dump`)."""
    return _ARMED.get("dump")
