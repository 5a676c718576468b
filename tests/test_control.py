"""Live training control: worker thread, commands from any thread, state machine under load."""

import random
import threading
import time

import pytest
import torch
import torch.nn as nn
from conftest import Net

import nbdebug
from nbdebug.control import State


def make_train(model, steps=5, lr=0.05, seed=0, on_step=None):
    def train():
        g = torch.Generator().manual_seed(seed)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        for i in range(steps):
            x = torch.randn(5, 8, generator=g)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), torch.zeros(5, 4)).backward()
            opt.step()
            if on_step:
                on_step(i)
        return "done"

    return train


@pytest.fixture
def dbg():
    torch.manual_seed(0)
    model = Net()
    d = nbdebug.Debugger(model, level="mix")
    d.model = model
    yield d
    d.close()


def test_run_returns_at_once_and_finishes(dbg):
    gate = threading.Event()
    dbg.run(lambda: (gate.wait(10), "ok")[1])
    assert dbg.state is State.RUNNING  # returned while the function is still blocked
    gate.set()
    assert dbg.wait(10) is State.FINISHED
    assert dbg._ctl.result == "ok"


def test_block_runs_in_caller_thread(dbg):
    seen = []
    dbg.run(lambda: seen.append(threading.current_thread()), block=True)
    assert seen == [threading.current_thread()] and dbg.state is State.FINISHED


def test_block_does_not_wait_forever_on_a_hit_it_alone_could_resume(dbg):
    """``run(block=True)`` trains on the caller's thread — in a notebook the thread that would handle the
    panel's CONTINUE — so a hit's pause there waited forever. It trains on with the hits kept, saying so once;
    ``steps=N`` (a pause after N steps) is refused for the same reason."""
    import warnings

    def train():
        opt = torch.optim.SGD(dbg.model.parameters(), lr=0.05)
        for i in range(5):
            x = torch.randn(5, 8)
            if i == 2:
                x[0, 0] = float("nan")  # NaN from step 2 on (the weights take it)
            opt.zero_grad()
            nn.functional.mse_loss(dbg.model(x), torch.zeros(5, 4)).backward()
            opt.step()
        return "done"

    dbg.watch("TO")
    caller = threading.Thread(target=dbg.run, args=(train,), kwargs={"block": True}, daemon=True)
    with warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        caller.start()
        caller.join(60)  # the thread that called run(block=True): before the fix it never came back
    assert not caller.is_alive(), "run(block=True) waits forever on a hit"
    assert len([w for w in told if "block=True" in str(w.message)]) == 1  # said once, not per hit
    assert dbg.state is State.FINISHED and dbg._ctl.result == "done"
    assert {h.step for h in dbg.hits if h.hits} == {2, 3, 4}
    with pytest.raises(ValueError, match="steps=N"):
        dbg.run(train, block=True, steps=2)
    dbg.run(train)  # on a worker thread a hit still pauses
    deadline = time.time() + 10
    while dbg.state is not State.PAUSED and time.time() < deadline:
        time.sleep(0.01)
    assert dbg.state is State.PAUSED
    dbg.terminate()
    assert dbg.wait(10) is State.TERMINATED


def test_exception_sets_failed_with_traceback(dbg):
    def boom():
        dbg.model(torch.randn(2, 8))
        raise RuntimeError("loss went sideways")

    dbg.run(boom)
    assert dbg.wait(10) is State.FAILED
    assert "RuntimeError: loss went sideways" in dbg.error and "boom" in dbg.error
    assert not dbg._ctl.thread.is_alive()
    # the partial step was closed so it can be inspected
    assert dbg.step_index == 1
    got = []
    dbg.on("error", got.append)
    dbg.run(boom)
    assert dbg.wait(60) is State.FAILED
    assert got and "loss went sideways" in got[0]  # delivered before wait() saw the state settle


def test_paused_start_and_step_count(dbg):
    dbg.run(make_train(dbg.model, steps=6), paused=True)
    assert dbg.state is State.PAUSED and dbg.step_index == 0
    dbg.cont(steps=2)
    assert dbg.wait(10) is State.PAUSED
    assert dbg.step_index == 2 and dbg.current_node is None
    dbg.cont(steps=1)
    assert dbg.wait(10) is State.PAUSED and dbg.step_index == 3
    dbg.cont()
    assert dbg.wait(10) is State.FINISHED and dbg.step_index == 6


@pytest.mark.parametrize("section", ["forward", "backward", "optimizer"])
def test_pause_issued_during_each_section(dbg, section):
    fired = []

    def request_pause(node):
        if node.section == section and not fired and dbg.step_index == 1:
            fired.append(node.name)
            threading.Thread(target=dbg.pause).start()  # from another thread, as a panel would
            time.sleep(0.05)

    dbg.session.subscribe("node", request_pause)
    dbg.run(make_train(dbg.model, steps=3))
    assert dbg.wait(10) is State.PAUSED
    assert dbg.step_index == 1
    node = dbg.graph[dbg.current_node]
    assert node.section == section
    dbg.cont()
    assert dbg.wait(10) is State.FINISHED


@pytest.mark.parametrize("section", ["forward", "backward", "optimizer"])
def test_terminate_issued_during_each_section_leaves_model_consistent(section):
    torch.manual_seed(0)
    model, ref = Net(), Net()
    ref.load_state_dict(model.state_dict())
    dbg = nbdebug.Debugger(model, level="mix")
    fired = []

    def request_terminate(node):
        if node.section == section and not fired and dbg.step_index == 1:
            fired.append(node.name)
            dbg.terminate()

    dbg.session.subscribe("node", request_terminate)
    dbg.run(make_train(model, steps=4))
    assert dbg.wait(10) is State.TERMINATED
    assert not dbg._ctl.thread.is_alive()
    # parameters equal a reference after a whole number of optimizer steps: never half-updated
    done = 2 if section == "optimizer" else 1
    make_train(ref, steps=done)()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q)
    dbg.close()  # hooks can still be detached
    assert torch.overrides._get_current_function_mode_stack() == []


def test_run_to_backward_node(dbg):
    dbg.run(make_train(dbg.model, steps=3), paused=True)
    make_train(Net(), steps=0)  # nothing
    dbg.cont(steps=1)
    dbg.wait(10)
    target = "Functional.linear.1.backward"
    assert target in dbg.graph
    dbg.run_to(target)
    assert dbg.wait(10) is State.PAUSED
    assert dbg.current_node == target and dbg.step_index == 1
    # the node's gradients of this step are readable while paused
    assert dbg.stats(target, "input.0")["shape"] == (5, 16)
    dbg.terminate()
    assert dbg.wait(10) is State.TERMINATED


def test_run_to_unknown_node_is_an_error(dbg):
    with pytest.raises(KeyError, match="no node named"):
        dbg.run_to("Functional.nothing.0.forward")


def test_next_node_walks_in_execution_order(dbg):
    dbg.run(make_train(dbg.model, steps=3), paused=True)
    dbg.cont(steps=1)
    dbg.wait(10)
    # data nodes (inputs, parameter values) do not execute; everything else does, in this order
    order = [n.name for n in dbg.graph.in_order() if n.kind not in ("input", "constant")
             and not (n.kind == "parameter" and n.section == "forward")]
    walked = []
    for _ in range(25):
        dbg.next_node()
        assert dbg.wait(10) is State.PAUSED
        walked.append(dbg.current_node)
    assert walked == order[: len(walked)]
    dbg.terminate()
    assert dbg.wait(10) is State.TERMINATED


def test_commands_from_many_threads_never_deadlock():
    torch.manual_seed(1)
    model = Net()
    dbg = nbdebug.Debugger(model, level="mix")
    rng = random.Random(7)
    t0 = time.monotonic()
    for seq in range(200):
        dbg.run(make_train(model, steps=3), paused=rng.random() < 0.5)
        for _ in range(rng.randint(1, 6)):
            cmd = rng.choice(["cont", "cont_n", "pause", "next", "run_to", "wait"])
            try:
                if cmd == "cont":
                    dbg.cont()
                elif cmd == "cont_n":
                    dbg.cont(steps=rng.randint(1, 2))
                elif cmd == "pause":
                    threading.Thread(target=dbg.pause).start()
                elif cmd == "next":
                    dbg.next_node()
                elif cmd == "run_to" and len(dbg.graph):
                    dbg.run_to(rng.choice(list(dbg.graph.nodes)))
                else:
                    dbg.wait(0.01)
            except KeyError:
                pass
        dbg.terminate()
        state = dbg.wait(10)
        assert state in (State.TERMINATED, State.FINISHED), (seq, state)
        assert not dbg._ctl.thread.is_alive()
    assert time.monotonic() - t0 < 240
    dbg.close()


def test_first_nonfinite_finds_the_origin():
    class Bad(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            h = self.fc(x)
            h = torch.log(h - 100.0)  # negative argument: NaN is born here
            return torch.relu(h) * 2

    model = Bad()
    with nbdebug.Debugger(model, level="L1") as dbg:
        model(torch.randn(3, 4)).sum().backward()
        node, slot, step = dbg.first_nonfinite()
        assert (node, slot, step) == ("Torch.log.0.forward", "output.0", 0)
        clean = nn.Linear(2, 2)
    with nbdebug.Debugger(clean, level="L1") as dbg2:
        clean(torch.ones(1, 2))
        assert dbg2.first_nonfinite() is None
