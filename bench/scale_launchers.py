"""bench.scale's real part: N kit launchers (`python -m fsdpkit.launcher`, the kit's rendezvous, zygote
workers) + 1 hot spare on this machine, each with one trivial worker (bench/scale_worker.py: an all-reduce
of one number and a beat per step), against the kit's store process.

Per N, in one run:
  start-up   launchers started at once -> all N in the first round: the machine's cost (2 cores start N
             launchers, N zygotes and N workers), printed apart, with the CPU seconds it took per node
  formation  the last member's join call -> the last member's complete round (rdzv_round events): the design
  steady     STEADY_S of training: the store's CPU and bytes, the machine's CPU per node, rank 0's steps per
             second, restarts no fault caused (false restarts) and live nodes judged gone (false expiries)
  node loss  node N-1's launcher, zygote and worker SIGSTOPped at once (a silent host): detection (the first
             survivor launcher that sees its group hang or fail), the round re-formed with the spare
             (its last member's rdzv_round), and rank 0's first step in the new group; the CPU seconds the
             machine spent per node on the event

The workers' signal (a survivor's hang detection) is the heartbeat monitor's auto timeout, learned from the
steps; the rendezvous' verdict on the lost node is its beat's expiry (keep-alive interval x attempts).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from fsdpkit.launcher.rendezvous.liveness import STALL_WINDOW_S
from fsdpkit.runtime.events import read_events

REPO = Path(__file__).resolve().parents[1]
STEP_S = 0.3
"""The trivial workers' step: long enough that 33 ranks' collectives leave the 2 cores to the launchers."""
STEADY_S = 8.0
FORM_TIMEOUT_S = 420.0
RECOVERY_TIMEOUT_S = 120.0


@contextlib.contextmanager
def store_process() -> Iterator[tuple[subprocess.Popen[str], str]]:
    """The kit's store (`python -m fsdpkit.launcher.store`) on a free port: (process, HOST:PORT)."""
    from fsdpkit.contracts.ports import free_port_run

    port = free_port_run()
    store = subprocess.Popen(
        [sys.executable, "-m", "fsdpkit.launcher.store", "--host", "127.0.0.1", "--port", str(port)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert store.stdout is not None
        store.stdout.readline()  # "serving"
        yield store, f"127.0.0.1:{port}"
    finally:
        store.send_signal(signal.SIGTERM)
        try:
            store.wait(timeout=10)
        except subprocess.TimeoutExpired:
            store.kill()


def proc_stat(pid: int) -> tuple[float, int, int]:
    """CPU seconds, bytes read + written, read + write syscalls of a process (its /proc stat and io)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return cpu, int(io["rchar"]) + int(io["wchar"]), int(io["syscr"]) + int(io["syscw"])


def _tree(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    return []


def _cpu(launchers: list[subprocess.Popen[bytes]]) -> float:
    """CPU seconds of every launcher's tree (launcher, zygote, workers) so far, ended children included."""
    total = 0.0
    for launcher in launchers:
        for p in _tree(launcher.pid):
            with contextlib.suppress(psutil.NoSuchProcess):
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
    return total


def _rss_mb(launchers: list[subprocess.Popen[bytes]]) -> float:
    """The launchers' trees' unique memory (USS: a zygote's pages shared with its fork count once)."""
    total = 0
    for launcher in launchers:
        for p in _tree(launcher.pid):
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                total += p.memory_full_info().uss
    return total / 1e6


def _until(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if found := check():
            return found
        time.sleep(0.1)
    raise RuntimeError(f"{what} not within {timeout_s:g} s")


def _launch(nodes: int, rank: int, endpoint: str, run_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "fsdpkit.launcher",
        "--nnodes", str(nodes), "--nproc-per-node", "1", "--node-rank", str(rank), "--spares", "1",
        "--rdzv-backend", "kit", "--rdzv-endpoint", endpoint, "--rdzv-id", f"scale{nodes}",
        "--rdzv-conf", "is_host=0", "--run-dir", str(run_dir), "--max-restarts", "5",
        "-m", "bench.scale_worker", str(run_dir), str(STEP_S),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "POD_NAME": f"node{rank}", "OMP_NUM_THREADS": "1"}
    with open(log, "wb") as out:
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


@dataclass(frozen=True)
class _Launched:
    """The N launchers and the spare of one run, and the folder their events go to."""

    nodes: int
    run_dir: Path
    launchers: list[subprocess.Popen[bytes]]

    def rounds(self, t: int) -> list[dict]:
        return [e for e in read_events(self.run_dir) if e["kind"] == "rdzv_round" and e["round"] == t]

    def steps_of(self, world: int, after: float) -> list[dict]:
        return [
            e for e in read_events(self.run_dir)
            if e["kind"] == "step" and e["world"] == world and e["ts"] > after
        ]  # fmt: skip


def measure(nodes: int) -> dict[str, float]:
    """One N: start-up, formation, steady, silent node loss with the spare (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix=f"scale{nodes}-") as tmp, store_process() as (store, endpoint):
        run_dir = Path(tmp) / "run"
        launchers: list[subprocess.Popen[bytes]] = []
        try:
            started = time.time()
            for rank in range(nodes + 1):  # rank N is the hot spare
                launchers.append(_launch(nodes, rank, endpoint, run_dir, Path(tmp) / f"node{rank}.log"))
            return _measure_on(_Launched(nodes, run_dir, launchers), store, Path(tmp), started)
        finally:
            for launcher in launchers:
                for p in _tree(launcher.pid):
                    with contextlib.suppress(psutil.NoSuchProcess):
                        p.kill()
            for launcher in launchers:
                launcher.wait()


def _measure_on(job: _Launched, store: subprocess.Popen[str], tmp: Path, started: float) -> dict[str, float]:
    """`measure` on launchers started at `started`: each phase in turn."""
    startup, formed, trained = _startup(job, started)
    steady = _steady(job, store, formed)
    # a loss in steady training: the start-up's stalls are out of every node's beat-gap window
    time.sleep(max(0.0, trained + STALL_WINDOW_S + 1.0 - time.time()))
    restarts_before = [e for e in read_events(job.run_dir) if e["kind"] == "restart"]
    loss = _node_loss(job, tmp)
    return {"nodes": job.nodes, **startup, **steady, "false_restarts": len(restarts_before), **loss}


def _startup(job: _Launched, started: float) -> tuple[dict[str, float], float, float]:
    """(start-up and formation figures, when round 1 formed, when its first step ended)."""
    nodes = job.nodes
    first = _until(lambda: (r := job.rounds(1)) and len(r) >= nodes and r, FORM_TIMEOUT_S, "round 1")
    formed = max(e["asked_at"] + e["wait_s"] for e in first)
    formation_s = formed - max(e["asked_at"] for e in first)
    startup_s, startup_cpu = formed - started, _cpu(job.launchers)
    trained = _until(lambda: job.steps_of(nodes, formed), FORM_TIMEOUT_S, "the first step")[0]["ts"]
    figures = {
        "startup_s": startup_s,
        "startup_cpu_per_node": startup_cpu / (nodes + 1),
        "formation_s": formation_s,
    }
    return figures, formed, trained


def _steady(job: _Launched, store: subprocess.Popen[str], formed: float) -> dict[str, float]:
    """STEADY_S of fault-free training once the heartbeat monitors know the step time."""
    nodes = job.nodes
    time.sleep(2.0)  # the heartbeat monitors learn the step time
    t0 = time.time()
    store0, cpu0 = proc_stat(store.pid), _cpu(job.launchers)
    time.sleep(STEADY_S)
    t1 = time.time()
    store1, cpu1 = proc_stat(store.pid), _cpu(job.launchers)
    memory_mb = _rss_mb(job.launchers)
    span = t1 - t0
    steady_steps = len([e for e in job.steps_of(nodes, t0) if e["ts"] <= t1])
    return {
        "store_cpu": (store1[0] - store0[0]) / span,
        "store_bytes_s": (store1[1] - store0[1]) / span,
        "machine_cpu_per_node": (cpu1 - cpu0) / span / (nodes + 1),
        "memory_mb_per_node": memory_mb / (nodes + 1),
        "steps_s": steady_steps / span,
    }


def _node_loss(job: _Launched, tmp: Path) -> dict[str, float]:
    """Node N-1 stopped silently: detection, the round re-formed with the spare, the first step after."""
    nodes = job.nodes
    victim = _tree(job.launchers[nodes - 1].pid)  # node N-1: launcher, zygote, worker
    for p in victim:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGSTOP)
    lost = time.time()
    cpu_lost = _cpu(job.launchers)

    def back() -> list[dict]:
        r = job.rounds(2)
        return r if len(r) >= nodes else []

    second = _until(back, RECOVERY_TIMEOUT_S, "the round with the spare")
    first_step = _until(lambda: job.steps_of(nodes, lost), RECOVERY_TIMEOUT_S, "the first step after")
    events = [e for e in read_events(job.run_dir) if e["ts"] > lost]
    signals = [e["ts"] for e in events if e["kind"] in ("hang_detected", "restart")]
    reformed = max(e["asked_at"] + e["wait_s"] for e in second)
    step_at = first_step[0]["ts"]
    return {
        "false_expiries": _gone_verdicts(tmp),
        "detect_s": min(signals) - lost if signals else float("nan"),
        "reform_s": reformed - lost,
        "first_step_s": step_at - lost,
        # each node's longest gap between its rendezvous beats, round 1 to its round-2 join
        "beat_gap_max_s": max(e["beat_gap_max_s"] for e in second),
        "event_cpu_per_node": (_cpu(job.launchers) - cpu_lost) / nodes,
    }


def _gone_verdicts(folder: Path) -> int:
    """Nodes the rendezvous judged gone ("round T: node X is gone" in the launchers' logs) besides the one
    that was lost: live nodes dropped, the false expiries."""
    names = set()
    for path in folder.glob("node*.log"):
        for line in path.read_text(errors="replace").splitlines():
            for marker in (": node ", ": joined node "):
                if marker in line and " is gone" in line:
                    names.add(line.split(marker, 1)[1].split(" ", 1)[0])
    return max(len(names) - 1, 0)


def table(rows: list[dict[str, float]]) -> str:
    head = (
        "| N | start-up s (CPU s/node) | formation s | store CPU (cores) | store kB/s | machine CPU s/node/s "
        "| MB/node | steps/s | false restarts | false expiries | longest beat gap s | detection s "
        "| round with the spare s | first step s | event CPU s/node |"
    )
    lines = [head, "|" + "---|" * 15]
    for r in rows:
        cells = [
            f"{r['nodes']}",
            f"{r['startup_s']:.1f} ({r['startup_cpu_per_node']:.1f})",
            f"{r['formation_s']:.3f}",
            f"{r['store_cpu']:.4f}",
            f"{r['store_bytes_s'] / 1e3:.1f}",
            f"{r['machine_cpu_per_node']:.4f}",
            f"{r['memory_mb_per_node']:.0f}",
            f"{r['steps_s']:.2f}",
            f"{r['false_restarts']}",
            f"{r['false_expiries']}",
            f"{r['beat_gap_max_s']:.2f}",
            f"{r['detect_s']:.2f}",
            f"{r['reform_s']:.2f}",
            f"{r['first_step_s']:.2f}",
            f"{r['event_cpu_per_node']:.3f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
