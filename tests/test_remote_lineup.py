"""A line-up that cannot bring the processes to one step boundary says so (warning, listener notice, job
panel status) instead of leaving them apart without a word."""

from __future__ import annotations

import types

import pytest
import zmq  # noqa: F401 - the listener needs ZeroMQ (tests/torch_only.py reads the imports)

import nbdebug
from nbdebug.ui.job_panel import JobPanel


def _proc(key, state, step):
    return types.SimpleNamespace(key=key, state=state, step_index=step, current_node=None,
                                 session=types.SimpleNamespace(step_index=step))


def test_line_up_timeout_is_reported(monkeypatch):
    listener = nbdebug.listen()
    try:
        # rank 0 paused after step 2 on a hit; rank 1 keeps running in step 7 and never answers a pause
        procs = [_proc(0, "paused", 3), _proc(1, "running", 7)]
        monkeypatch.setattr(listener, "live", lambda: procs)
        asked = []
        monkeypatch.setattr(listener, "request_all",
                            lambda sources, op, args, *a, **k: asked.append((op, dict(args))) or
                            [(None, []) for _ in sources])
        with pytest.warns(RuntimeWarning, match="could not line the processes up"):
            assert listener.line_up(timeout=0.3) is None
        assert ("pause_at_step", {"step": 7}) in asked  # it did try: the running rank's step
        assert "0: paused in step 3" in listener.notice and "1: running in step 7" in listener.notice
        panel = JobPanel(listener.job, loop=None)
        panel.refresh()
        assert "could not line the processes up" in panel.status.value
        # once they are lined up, the notice goes
        procs[:] = [_proc(0, "paused", 8), _proc(1, "paused", 8)]
        assert listener.line_up(timeout=0.3) == 7
        assert listener.notice == ""
    finally:
        listener.close()
