"""The garbage collector's young-generation threshold while a capture is attached.

A capture allocates tens of thousands of small containers per step (records, keys, dict entries), most of
them dropped at the step's end. At Python's default threshold (700 allocations) that means tens of young
collections per step, and the full collections they trigger walk the whole heap — torch, transformers,
the model: hundreds of thousands of objects. Measured on the zoo's GPT-2 and MobileNet at ``mix``: 9–11 ms
of collection per step, 15–20 % of the captured step's CPU time; with a threshold of 20,000, 0.2–0.4 ms.

While at least one capture holds it, the young-generation threshold is at least :data:`YOUNG`; collections
still run, only less often. The thresholds found come back when the last holder lets go — unless someone
changed them meanwhile (then theirs stay). ``NBDEBUG_GC_TUNE=0`` leaves the collector alone.

>>> import gc
>>> before = gc.get_threshold()
>>> release = hold()
>>> gc.get_threshold()[0] >= YOUNG or os.environ.get("NBDEBUG_GC_TUNE") == "0"
True
>>> release(); gc.get_threshold() == before
True
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable

YOUNG = 20_000

_lock = threading.Lock()
_holders = 0
_saved: tuple[int, ...] | None = None  # the thresholds found by the first holder
_set: tuple[int, ...] | None = None  # the thresholds we set (to tell whether someone changed them since)


def hold() -> Callable[[], None]:
    """Raise the young threshold for as long as the returned ``release()`` has not been called (it may be
    called more than once; only the first call counts)."""
    global _holders, _saved, _set
    if os.environ.get("NBDEBUG_GC_TUNE") == "0":
        return lambda: None
    with _lock:
        if _holders == 0:
            _saved = gc.get_threshold()
            if _saved[0] and _saved[0] < YOUNG:  # 0: the user disabled automatic collection; keep it so
                gc.set_threshold(YOUNG, *_saved[1:])
            _set = gc.get_threshold()
        _holders += 1
    done = [False]

    def release() -> None:
        global _holders, _saved, _set
        with _lock:
            if done[0]:
                return
            done[0] = True
            _holders -= 1
            if _holders == 0 and _saved is not None:
                if gc.get_threshold() == _set:
                    gc.set_threshold(*_saved)
                _saved = _set = None

    return release
