"""The training loop's prints under ``dbg.run`` reach the cell that ran it (issue #22 item 12), also when
training was started paused and resumed by a panel button (a comm message) while a later cell ran.

A real ipykernel (jupyter_client) plays the kernel; the test plays the front end: it runs cells, and
"clicks CONTINUE" by sending a comm message whose handler calls ``dbg.cont()``, as the panel's button does.
"""

from __future__ import annotations

import queue
import time
import uuid

import jupyter_client.manager
import pytest

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(180)]

SETUP = """
import time, torch, nbdebug
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
dbg = nbdebug.Debugger(model)

def train(steps=4):
    for i in range(steps):
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        print(f"train-line {i}", flush=True)
        time.sleep(0.2)

def on_open(comm, msg):
    comm.on_msg(lambda m: dbg.cont())   # the panel's CONTINUE button: a comm message calls cont()
get_ipython().kernel.comm_manager.register_target("test.button", on_open)
"""


def _execute(kc, code: str) -> str:
    msg_id = kc.execute(code)
    deadline = time.monotonic() + 60
    while True:
        reply = kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            assert reply["content"]["status"] == "ok", reply["content"]
            return msg_id


def _send(kc, msg_type: str, content: dict) -> str:
    msg = kc.session.msg(msg_type, content)
    kc.shell_channel.send(msg)
    return msg["header"]["msg_id"]


def test_prints_of_a_paused_run_resumed_by_a_button_go_to_the_cell_that_ran_it():
    km = jupyter_client.manager.KernelManager(kernel_name="python3")
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        _execute(kc, SETUP)
        run_cell = _execute(kc, "dbg.run(train, paused=True)")
        later_cell = _execute(kc, "x = 1  # a later cell, where the panel is")
        comm_id = uuid.uuid4().hex
        _send(kc, "comm_open", {"comm_id": comm_id, "target_name": "test.button", "data": {}})
        _send(kc, "comm_msg", {"comm_id": comm_id, "data": {"command": "continue"}})  # the click
        lines: dict[str, str] = {}
        deadline = time.monotonic() + 60
        while len(lines) < 4 and time.monotonic() < deadline:
            try:
                msg = kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            if msg["msg_type"] == "stream":
                for line in msg["content"]["text"].splitlines():
                    if line.startswith("train-line"):
                        lines[line] = msg["parent_header"].get("msg_id")
        assert sorted(lines) == [f"train-line {i}" for i in range(4)], lines
        assert set(lines.values()) == {run_cell}, (lines, run_cell, later_cell)
        _execute(kc, "assert dbg.wait(30).value == 'finished', dbg.error")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
