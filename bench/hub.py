"""The notebook's listener under many ranks: hub CPU per training step and pause latency.

Simulated ranks speak the real protocol (``nbdebug.remote.protocol``): each has its own ZeroMQ socket,
says hello with the token, and every step sends one ``step`` message as an agent does — ``--rows``
statistics rows (a model's captured tensors at L0), their names once per connection — plus a ping a
second; it answers ``pause_at_step`` / ``cont`` / ``terminate`` like an agent. Ranks run in
``--workers`` processes (one loop per process drives all its ranks), stepping together every
``--period`` seconds as ranks in a collective do.

Measured in this (the notebook's) process, which only runs the listener and its ``Job`` (the panel's model,
unless ``--no-job``): **hub CPU per step** (process CPU time over the measured steps ÷ steps: decoding,
mirroring every rank's table, events, the job's per-rank step summaries) and **pause
latency** (``listener.pause_all()`` until every rank reports ``paused``; it includes waiting for the
step boundary, at most the period plus one step of margin) and **command latency** (one
``request`` round trip to one rank).

``--real 2 4`` measures the same with real ranks: ``torchrun --nproc-per-node N -m nbdebug.run`` on a
small DistributedDataParallel model (gloo, CPU) — every rank a real attached Debugger.

Run: ``.venv/bin/python bench/hub.py --ranks 64 256 [--rows 1000] [--steps 20] [--period 1.0]
[--real 2 4]``; ``--out`` writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _summary_step(r: int, step: int, rows: int, series: int, named: bool, rng) -> tuple[dict, list]:
    """What an agent in summary mode adds to a ``step`` message: its StepSummary and its monitor row (the
    series named on the connection's first row, ids after; ``monitor_wire.py``)."""
    import numpy as np

    from nbdebug.job.summary import StepSummary
    from nbdebug.remote import protocol as P

    loss = float(2.0 / (1 + step) + rng.random() * 0.01)
    summary = StepSummary(r, step, rows, 0, 0, float(rng.random() * 4), loss, 0, None,
                          float(1 + rng.random()), 1.0).to_dict()
    keys = [["Run", "loss"], ["Run", "grad_norm_total"]] + [
        [f"Module.layer{i // 3}", ("output_norm", "output_grad_norm", "output_max_abs")[i % 3]]
        for i in range(series - 2)]
    values = rng.random(series).astype("<f4")
    values[0] = loss
    head = {"start": series if named else 0, "keys": [] if named else keys, "rows": series}
    return {"summary": summary, "monitor": head}, [P.array_frame(np.arange(series, dtype="<i4")),
                                                   P.array_frame(values)]


def _rank_loop(address: str, token: str, ranks: list[int], world: int, rows: int, period: float,
               stop_at: float, series: int = 200) -> None:
    """One worker process: the given ranks, each a DEALER socket stepping every ``period`` seconds; in
    summary mode (the listener's welcome says ``detail: summary``) a rank sends its summary and monitor row,
    and its full table only after a ``tables`` request."""
    import numpy as np
    import zmq

    from nbdebug.remote import protocol as P
    from nbdebug.session.graph import Graph
    from nbdebug.session.stats import StatsTable

    ctx = zmq.Context()
    ctx.setsockopt(zmq.MAX_SOCKETS, 4 * len(ranks) + 64)
    rng = np.random.default_rng(0)
    keys = [(f"Module.layer{i // 2}.Linear.forward.0", f"output.{i % 2}") for i in range(rows)]
    graph = Graph()
    for name, _slot in keys:
        graph.add_node(name, kind="module", op_type="Linear", scope=name.split(".")[1])
    values = rng.random((rows, 10))
    values[:, 5:9] = 0  # zero / NaN / +Inf / -Inf counts: a healthy step
    values[:, 9] = 32 * 256  # elements
    table = StatsTable.from_rows(keys, ["float32"] * rows, [(32, 256)] * rows, values)
    socks, books, deltas, steps, pause_at, paused = {}, {}, {}, {}, {}, {}
    summary, full, named = {}, {}, {}
    for r in ranks:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(f"tcp://{address}")
        s.send_multipart(P.encode({"type": "hello", "token": token, "pid": os.getpid() * 1000 + r,
                                   "host": socket.gethostname(), "rank": r, "world_size": world,
                                   "framework": "pytorch", "device": "cpu", "level": "L0", "stats_window": 8}))
        socks[r], books[r], deltas[r], steps[r], pause_at[r], paused[r] = s, P.KeyBook(), P.GraphDelta(), 0, None, False
        summary[r], full[r], named[r] = False, False, False
    by_sock = {s: r for r, s in socks.items()}
    poller = zmq.Poller()
    for s in socks.values():
        poller.register(s, zmq.POLLIN)
    next_step = time.monotonic() + period
    last_ping = 0.0
    ended: set[int] = set()
    while time.monotonic() < stop_at:
        for s, _ev in poller.poll(max(0, int((next_step - time.monotonic()) * 1000))):
            r = by_sock[s]
            head, _ = P.decode(s.recv_multipart())
            if head["type"] == "welcome":  # then its state, as an agent's sync and state follow a welcome
                summary[r] = head.get("detail") == "summary"
                s.send_multipart(P.encode({"type": "state", "state": "paused" if paused[r] else "running",
                                           "step_index": steps[r]}))
            if head["type"] != "request":
                continue
            op, args = head["op"], head.get("args", {})
            if op == "tables":
                full[r] = bool(args.get("on"))
            result = None
            if op == "pause_at_step":  # as Controller.pause_after: nothing pending when paused at S or later
                at = None if args.get("step") is None else int(args["step"])
                pause_at[r] = None if at is not None and paused[r] and steps[r] - 1 >= at else at
                result = {"step_index": steps[r], "state": "paused" if paused[r] else "running",
                          "at_boundary": paused[r]}
            elif op == "cont":
                paused[r] = False
            elif op == "terminate":
                ended.add(r)
            s.send_multipart(P.encode({"type": "reply", "re": head["id"], "ok": True, "result": result}))
            if len(ended) == len(socks):
                stop_at = 0
            if op == "cont":
                s.send_multipart(P.encode({"type": "state", "state": "running", "step_index": steps[r]}))
        now = time.monotonic()
        if now - last_ping >= 1.0:
            last_ping = now
            for s in socks.values():
                s.send_multipart(P.encode({"type": "ping"}))
        if now < next_step:
            continue
        next_step += period
        for r, s in socks.items():
            if paused[r]:
                continue
            step = steps[r]
            msg = {"type": "step", "step": step, "graph": deltas[r].take(graph), "step_index": step + 1}
            frames = []
            if summary[r]:
                more, frames = _summary_step(r, step, rows, series, named[r], rng)
                msg.update(more)
                named[r] = True
            if not summary[r] or full[r]:
                msg["table"], table_frames = P.table_header(table, books[r])
                frames = [*table_frames, *frames]
            s.send_multipart(P.encode(msg, frames))
            steps[r] = step + 1
            if pause_at[r] is not None and step >= pause_at[r]:
                pause_at[r], paused[r] = None, True
                s.send_multipart(P.encode({"type": "state", "state": "paused", "step_index": steps[r],
                                           "pause_reason": "paused"}))
    for s in socks.values():
        s.close(0)
    ctx.term()


DDP_SCRIPT = """\
import sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
    *[m for _ in range(8) for m in (torch.nn.Linear(64, 64), torch.nn.ReLU())]))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
while True:
    t = time.monotonic()
    model(torch.randn(32, 64)).pow(2).mean().backward()
    opt.step(); opt.zero_grad()
    time.sleep(max(0.0, float(sys.argv[1]) - (time.monotonic() - t)))
"""


def _simulated(listener, ranks: int, rows: int, steps: int, period: float, workers: int, series: int = 200,
               pauses: int = 3) -> list:
    stop_at = time.monotonic() + 900 + (steps + 4 * pauses) * period * 3  # else terminate_all ends them
    groups = [list(range(ranks))[i::workers] for i in range(workers)]
    procs = [mp.get_context("spawn").Process(target=_rank_loop, args=(listener.address, listener.token, g, ranks,
                                                                       rows, period, stop_at, series), daemon=True)
             for g in groups if g]
    for p in procs:
        p.start()
    return procs


def _real(listener, ranks: int, period: float, tmp: Path) -> list:
    import subprocess

    script = tmp / "ddp_bench.py"
    script.write_text(DDP_SCRIPT)
    env = dict(os.environ, **listener.env, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return [subprocess.Popen([torchrun, "--nproc-per-node", str(ranks), "-m", "nbdebug.run", str(script),
                              str(period)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]


def _rss_mb() -> float:
    """This process's resident memory (MB; Linux ``/proc``, else NaN)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _pause_latency(listener, srcs: list, period: float, phase: float) -> tuple[float, bool]:
    """``pause_all`` ``phase`` periods after a step boundary (all ranks' step messages in), until every rank
    reports ``paused``; whether they all stand at one step."""
    first = min(s.step_index for s in srcs)
    while min(s.step_index for s in srcs) <= first:  # the next boundary, every rank's step message in
        time.sleep(0.01)
    time.sleep(phase * period)
    t = time.monotonic()
    furthest = max(s.step_index for s in srcs)
    cpu = time.process_time()
    target = listener.pause_all()
    asked, cpu = time.monotonic() - t, time.process_time() - cpu
    while not all(str(s.state) == "paused" for s in srcs):
        if time.monotonic() - t > 60:
            raise TimeoutError(f"not all paused: {[str(s.state) for s in srcs]}")
        time.sleep(0.002)
    took = time.monotonic() - t
    print(f"  pause_all at {phase:.2f} of the step: the furthest rank in step {furthest}, all paused after step "
          f"{target} (+{target - furthest}); requests answered in {asked:.2f} s (hub CPU meanwhile {cpu:.2f} s), all "
          f"paused in {took:.2f} s",
          file=sys.stderr, flush=True)
    return took, len({s.step_index for s in srcs}) == 1


def measure(ranks: int, rows: int, steps: int, period: float, workers: int, real: bool = False,
            job: bool = True, series: int = 200, pauses: int = 3) -> dict:
    import tempfile

    import nbdebug

    listener = nbdebug.listen(quiet=True)
    tmp = Path(tempfile.mkdtemp())
    procs = _real(listener, ranks, period, tmp) if real else _simulated(listener, ranks, rows, steps, period,
                                                                        workers, series, pauses)
    try:
        t_join = time.monotonic()
        listener.wait_for(ranks, 120 + ranks / 10)
        print(f"  {ranks} ranks connected in {time.monotonic() - t_join:.1f} s", file=sys.stderr, flush=True)
        if job:  # the panel's model: every rank's steps summarised as they arrive (first non-finite, overview)
            listener.job  # noqa: B018 - made now, it follows every rank
        srcs = list(listener.sources.values())
        while min(s.step_index for s in srcs) < 3:  # warm up: names and graphs sent
            time.sleep(0.05)
        first = min(s.step_index for s in srcs)
        load0 = os.getloadavg()[0]
        cpu0, t0 = time.process_time(), time.monotonic()
        while min(s.step_index for s in srcs) < first + steps:
            time.sleep(0.05)
        cpu = time.process_time() - cpu0
        wall = time.monotonic() - t0
        behind = max(s.step_index for s in srcs) - min(s.step_index for s in srcs)
        rss = _rss_mb()
        print(f"  hub CPU {1000 * cpu / steps:.1f} ms/step over {steps} steps ({wall:.1f} s), ranks {behind} steps "
              f"apart; hub RSS {rss:.0f} MB", file=sys.stderr, flush=True)
        rtts = []
        for _ in range(5):
            t = time.monotonic()
            listener.request(srcs[len(rtts) * 7 % len(srcs)], "recheck", {}, timeout=120)  # a no-op: no watchpoints
            rtts.append(time.monotonic() - t)
        latencies, same = [], True
        for i in range(pauses):  # at several phases of the step: just after a boundary is the worst
            lat, one = _pause_latency(listener, srcs, period, (0.05, 0.5, 0.9)[i % 3])
            latencies.append(lat)
            same = same and one
            if i + 1 < pauses:
                listener.cont_all()
        summary_mode = srcs[0].detail == "summary"
        listener.terminate_all()
        kept = srcs[0].session.steps
        rows = len(kept[max(kept)]) if kept else rows
        return {"ranks": ranks, "real": real, "job": job, "rows": rows, "period_s": period, "steps": steps,
                "summary_mode": summary_mode, "series": series if summary_mode else None,
                "hub_cpu_ms_per_step": 1000 * cpu / steps, "hub_cpu_share": cpu / wall, "hub_rss_mb": rss,
                "steps_apart_at_end": behind, "command_rtt_ms": 1000 * statistics.median(rtts),
                "pause_latency_s": max(latencies), "pause_latencies_s": latencies,
                "pause_periods": max(latencies) / period, "all_paused_at_one_step": same,
                "load_average": [load0, os.getloadavg()[0]], "cpus": os.cpu_count()}
    finally:
        listener.close()
        for p in procs:
            if real:
                try:
                    p.wait(30)
                except Exception:  # noqa: BLE001
                    p.kill()
                continue
            p.join(10)
            if p.is_alive():
                p.kill()


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="*", default=[64, 256], help="simulated ranks")
    ap.add_argument("--rows", type=int, default=1000, help="statistics rows per rank and step")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--period", type=float, default=1.0, help="seconds per training step")
    ap.add_argument("--workers", type=int, default=2, help="processes simulating the ranks")
    ap.add_argument("--real", type=int, nargs="*", default=[], help="also real torchrun jobs of these sizes")
    ap.add_argument("--no-job", action="store_true", help="the listener alone, without the panel's Job")
    ap.add_argument("--series", type=int, default=200, help="monitor series per rank and step (summary mode)")
    ap.add_argument("--pauses", type=int, default=3, help="pause_all measurements (worst reported)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    results = []
    for n, real in [(n, True) for n in args.real] + [(n, False) for n in args.ranks]:
        r = measure(n, args.rows, args.steps, args.period, args.workers, real, not args.no_job, args.series,
                    args.pauses)
        results.append(r)
        what = (f"summary + {r['series']} monitor series" if r["summary_mode"] else f"{r['rows']} rows")
        print(f"{n:5d} {'real' if real else 'simulated'} ranks × {what}: "
              f"hub CPU {r['hub_cpu_ms_per_step']:.1f} ms/step "
              f"({100 * r['hub_cpu_share']:.0f}% of a core), command round trip {r['command_rtt_ms']:.1f} ms, "
              f"pause_all → all paused {r['pause_latency_s']:.2f} s worst of {len(r['pause_latencies_s'])} "
              f"({r['pause_periods']:.2f} periods; one step: {r['all_paused_at_one_step']}); "
              f"load average {r['load_average'][0]:.1f} on {r['cpus']} CPUs", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
