"""The kernel side of the lab extension, spoken to over the real Jupyter protocol.

A real ipykernel (via jupyter_client) plays the part of the kernel; the test plays JupyterLab: it
reads the ``nbdebug.status`` comm on IOPub and sends commands the way the extension does — silent
``execute_request`` on a kernel subshell (JEP 91), so they arrive while the main shell is busy.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from typing import Any

import jupyter_client.manager
import pytest
from conftest import train_steps

import nbdebug
from nbdebug.lab import command, status

TRAIN = """
import time, torch, nbdebug
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def train(steps=3000):
    for i in range(steps):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.005)
"""


class Kernel:
    """A kernel client that keeps every IOPub message it has seen."""

    def __init__(self, km: Any, kc: Any) -> None:
        self.km, self.kc = km, kc
        self.iopub: list[dict[str, Any]] = []
        self.replies: dict[str, dict[str, Any]] = {}

    def pump(self, timeout: float = 0.05) -> None:
        while True:
            try:
                self.iopub.append(self.kc.get_iopub_msg(timeout=timeout))
            except queue.Empty:
                break
        while True:
            try:
                msg = self.kc.get_shell_msg(timeout=0.001)
            except queue.Empty:
                break
            self.replies[msg["parent_header"]["msg_id"]] = msg

    def send_execute(self, code: str, subshell: str | None = None, silent: bool = False) -> str:
        msg = self.kc.session.msg("execute_request", {
            "code": code, "silent": silent, "store_history": not silent, "user_expressions": {},
            "allow_stdin": False, "stop_on_error": False})
        if subshell is not None:
            msg["header"]["subshell_id"] = subshell
        self.kc.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    def reply(self, msg_id: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while msg_id not in self.replies:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no reply to {msg_id} within {timeout} s")
            self.pump()
        return self.replies[msg_id]

    def execute(self, code: str, subshell: str | None = None, timeout: float = 60.0) -> dict[str, Any]:
        reply = self.reply(self.send_execute(code, subshell), timeout)
        assert reply["content"]["status"] == "ok", reply["content"]
        return reply

    def command(self, name: str, subshell: str | None) -> dict[str, Any]:
        """Exactly what the extension sends for ``nbdebug:<name>``."""
        code = f'__import__("nbdebug.lab").lab.command("{name}")'
        return self.reply(self.send_execute(code, subshell, silent=True))["content"]

    def create_subshell(self) -> str:
        msg = self.kc.session.msg("create_subshell_request", {})
        self.kc.control_channel.send(msg)
        reply = self.kc.get_control_msg(timeout=10)
        assert reply["content"]["status"] == "ok", reply["content"]
        return reply["content"]["subshell_id"]

    def statuses(self) -> list[dict[str, Any]]:
        """Every status the kernel published on the nbdebug comm, oldest first."""
        self.pump()
        out = []
        for m in self.iopub:
            t = m["header"]["msg_type"]
            if t == "comm_open" and m["content"].get("target_name") == "nbdebug.status":
                out.append(m["content"]["data"]["status"])
            elif t == "comm_msg" and "status" in m["content"]["data"]:
                out.append(m["content"]["data"]["status"])
        return out

    def wait_status(self, pred: Any, timeout: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [s for s in self.statuses() if pred(s)]
            if found:
                return found[-1]
        raise TimeoutError(f"no matching status in {timeout} s; last: {self.statuses()[-3:]}")

    def stream(self, parent: str) -> str:
        self.pump()
        return "".join(m["content"]["text"] for m in self.iopub
                       if m["header"]["msg_type"] == "stream" and m["parent_header"].get("msg_id") == parent)


@pytest.fixture
def kernel() -> Iterator[Kernel]:
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="python3", startup_timeout=120)
    try:
        yield Kernel(km, kc)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_status_comm_and_commands_over_a_subshell(kernel: Kernel) -> None:
    info = kernel.reply(kernel.kc.kernel_info())["content"]
    assert "kernel subshells" in info.get("supported_features", []), "ipykernel 7 supports subshells (JEP 91)"
    sub = kernel.create_subshell()

    # Creating a Debugger in a kernel opens the status comm by itself.
    kernel.execute(TRAIN + "\ndbg = nbdebug.Debugger(model)\ndbg.run(train, paused=True)\n")
    first = kernel.wait_status(lambda s: s["state"] == "paused")
    assert first["step"] == 0 and first["hits"] == 0 and first["framework"] == "pytorch"
    opens = [m for m in kernel.iopub if m["header"]["msg_type"] == "comm_open"]
    assert [m["content"]["target_name"] for m in opens] == ["nbdebug.status"]

    # A command that does not apply says why and changes nothing.
    bad = kernel.command("pause", sub)
    assert bad["status"] == "error" and "cannot pause while training is paused" in bad["evalue"]

    assert kernel.command("continue", sub)["status"] == "ok"
    kernel.wait_status(lambda s: s["state"] == "running" and s["step"] >= 1)

    # Block the main shell (as a long cell would); pause must still get through on the subshell.
    blocked = kernel.send_execute("print('waited:', dbg.wait(60))")
    time.sleep(0.5)
    t0 = time.monotonic()
    assert kernel.command("pause", sub)["status"] == "ok"
    paused_after = time.monotonic() - t0
    assert kernel.reply(blocked, timeout=30)["content"]["status"] == "ok"
    assert "waited: paused" in kernel.stream(blocked)
    assert paused_after < 10, f"the pause command took {paused_after:.1f} s to come back"
    kernel.wait_status(lambda s: s["state"] == "paused" and s["reason"] == "paused")

    # While the main thread sleeps, the status still advances (the sender thread polls).
    n_before = len(kernel.statuses())
    sleeper = kernel.send_execute("dbg.cont(); time.sleep(2.5)")
    time.sleep(2.0)
    during = kernel.statuses()[n_before:]
    assert sleeper not in kernel.replies, "the sleeping cell should still run"
    steps = [s["step"] for s in during if s["state"] == "running"]
    assert len(steps) >= 2 and steps[-1] > steps[0], during
    kernel.reply(sleeper)

    # Step: exactly one more step, then paused again.
    kernel.command("pause", sub)
    before = kernel.wait_status(lambda s: s["state"] == "paused")
    kernel.pump(0.3)
    assert kernel.command("step", sub)["status"] == "ok"
    after = kernel.wait_status(lambda s: s["state"] == "paused" and s["step"] == before["step"] + 1)
    assert after["reason"].startswith("step ")

    assert kernel.command("next-node", sub)["status"] == "ok"
    node = kernel.wait_status(lambda s: s["state"] == "paused" and s["current_node"])
    assert node["reason"] == "next node"

    assert kernel.command("terminate", sub)["status"] == "ok"
    kernel.wait_status(lambda s: s["state"] == "terminated")

    # A frontend that attaches later asks for the status and gets it.
    comm_id = opens[0]["content"]["comm_id"]
    n_before = len(kernel.statuses())
    kernel.kc.shell_channel.send(kernel.kc.session.msg("comm_msg", {"comm_id": comm_id,
                                                                    "data": {"request": "status"}}))
    kernel.wait_status(lambda s: s["state"] == "terminated" and len(kernel.statuses()) > n_before)

    # Closing the debugger empties the status item.
    kernel.execute("dbg.close()")
    kernel.wait_status(lambda s: s["state"] == "none")


def test_load_ext_reopens_the_status_comm(kernel: Kernel) -> None:
    kernel.execute(TRAIN + "\ndbg = nbdebug.Debugger(model)\n")
    # The frontend may be gone (or had no extension) and the comm closed: %load_ext brings it back.
    kernel.execute("from nbdebug.lab.channel import CHANNEL\nCHANNEL.close()\nassert not CHANNEL.open")
    n_opens = sum(m["header"]["msg_type"] == "comm_open" for m in kernel.iopub)
    kernel.execute("%load_ext nbdebug.lab")
    kernel.pump(0.3)
    opens = [m for m in kernel.iopub if m["header"]["msg_type"] == "comm_open"]
    assert len(opens) == n_opens + 1 and opens[-1]["content"]["data"]["status"]["state"] == "idle"
    kernel.execute("dbg.run(train, steps=2)")
    kernel.wait_status(lambda s: s["state"] == "paused" and s["step"] == 2)
    kernel.execute("dbg.close()")


def test_commands_check_their_name_the_debugger_and_the_state(net: Any) -> None:
    with pytest.raises(ValueError, match="unknown nbdebug command 'go'; commands are continue, step"):
        command("go")
    dbg = nbdebug.Debugger(net)
    try:
        assert status() == {"state": "idle", "step": 0, "shown_step": None, "hits": 0, "current_node": None,
                            "reason": "",
                            "framework": "pytorch"}
        with pytest.raises(RuntimeError, match="cannot continue while training is idle"):
            command("continue")
        dbg.watch("TO")
        dbg.run(lambda: train_steps(net, 3), paused=True)
        with pytest.raises(RuntimeError, match="cannot pause while training is paused"):
            command("pause")
        assert command("next-node") in ("running", "paused")
        assert dbg.wait(30) == "paused" and dbg.pause_reason == "next node"
        assert status()["current_node"] == dbg.current_node is not None
        command("step")
        assert dbg.wait(30) == "paused" and status()["step"] == 1 and status()["reason"] == "step 0 done"
        command("terminate")
        assert dbg.wait(30) == "terminated" and status()["state"] == "terminated"
    finally:
        dbg.close()
    assert status()["state"] == "none"
    with pytest.raises(RuntimeError, match="no live nbdebug Debugger"):
        command("pause")
