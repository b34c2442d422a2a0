"""The control plane as the job grows: the kit's rendezvous (and torch's c10d beside it) at many nodes.

`python -m bench.scale [--quick] [--nodes 4,16,64] [--launchers 4,16]` runs two parts in one run:

Light nodes, for each N and each design (the kit's, training/launcher/rendezvous/kit.py, and torch's c10d
with the kit's spares, training/launcher/rendezvous/c10d.py; each with the launcher's keep-alive defaults):
N member nodes and one hot spare against the kit's real store process (`python -m fsdpkit.launcher.store`).
A node is a handler and a thread that does what the kit's agent does with it (`next_rendezvous`, then a
membership check every monitor interval, re-joining when a node waits), without workers: many nodes share a
client process so that 2 cores hold hundreds of them. The victim node has a process of its own, so that it
can be lost the way a host is lost: SIGSTOP (silent: its socket stays open, nothing answers), then SIGKILL at
the end.
  formation  from the last member's join call to the last member's complete round
  steady     STEADY_S of fault-free membership: the store process' CPU and bytes (its /proc stat and io:
             every byte it read or wrote on its sockets), the compare-and-set writes of the rendezvous state
             and how many failed (another node wrote first), the client processes' CPU, and false expiries
             (a live member dropped from the round)
  node loss  the victim stopped, in steady training (kit: once the start-up's stalls are out of the
             victim's 30 s beat-gap window, which sets its limit): detection (c10d: the first member that
             sees the spare waiting, which torch allows once the victim's keep-alive expired; kit: the round
             leader's verdict) and re-forming (the last member back in a complete round with the spare)

Real launchers (bench/scale_launchers.py): N kit launchers with trivial workers + 1 spare, up to 32.

The growth of each figure is a least-squares fit of log(figure) on log(N) (`growth`); the projection to
1,024 nodes extends that fit. The clients' CPU is the machine's, not the design's: on 2 cores it slows the
beats of many nodes at once, so it is printed apart (CPU seconds per node per second), never folded into the
store's figures.
RESULT nodes_light_max=<largest light N> light_formation_growth=<exponent> store_bytes_growth=<exponent>
store_cpu_growth=<exponent> recovery_growth=<exponent of detection + re-forming> false_expiries=<count, light
and real> projected_store_cpu_1024=<cores the store needs at 1,024 + 64 nodes> projected_control_1024_s=
<detection + re-forming at 1,024 nodes, each along its own fit> nodes_max=<largest real N>
formation_growth=<exponent, real launchers> false_restarts=<count> beat_gap_max_s=<longest gap of a live
node's beats> projected_recovery_1024_s=<whole node-loss recovery with a spare at 1,024 nodes>, and the c10d
design's figures with the prefix c10d_.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import scale_launchers
from fsdpkit.launcher.cli import RDZV_DEFAULTS
from fsdpkit.launcher.rendezvous.liveness import STALL_WINDOW_S
from fsdpkit.ops.plan.calibration import growth, project, write_section

REPO = Path(__file__).resolve().parents[1]
KEEP_ALIVE = {
    design: (float(conf["keep_alive_interval"]), int(conf["keep_alive_max_attempt"]))
    for design, conf in RDZV_DEFAULTS.items()
}
"""Each design's keep-alive interval and attempts: the launcher's defaults."""
MONITOR_S = 0.1
"""The launcher's --monitor-interval: how often the agent asks whether a node waits."""
NODES_PER_PROCESS = 32
STEADY_S = 6.0
FORM_TIMEOUT_S = 240.0
RECOVERY_TIMEOUT_S = 120.0
PROJECT_TO = 1024 + 64
BYTES_GROWTH_GOAL = 1.1
"""The highest exponent of the store's bytes per second in N that a design may show: per-node liveness must
cost O(1) bytes per beat, so the store's traffic grows about linearly with N."""


# --- a client process: many light nodes ---------------------------------------------------------------------


@dataclass(frozen=True)
class _ClientJob:
    """What every light node of a client process shares: the store, the job and the node's part in it."""

    endpoint: str
    run_id: str
    nodes: int
    """Member nodes of the job (min and max of the rendezvous)."""
    role: str
    """member, spare or victim."""
    design: str
    """kit or c10d."""


class _ClientOut:
    """The client's stdout (one JSON line per event) and its compare-and-set counters, behind one lock as
    every node thread writes both."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sets = 0
        self.failed = 0

    def emit(self, **fields: object) -> None:
        with self.lock:
            print(json.dumps({"ts": time.time(), **fields}), flush=True)

    def count_cas(self) -> None:
        """Counts every write of the rendezvous state to the store, and those that failed (another node
        wrote first), by wrapping the backend's `set_state` for this process."""
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

        original_set = C10dRendezvousBackend.set_state
        out = self

        def counting_set(self, state, token=None):  # type: ignore[no-untyped-def]
            result = original_set(self, state, token)
            with out.lock:
                out.sets += 1
                out.failed += 0 if result is not None and result[2] else 1
            return result

        C10dRendezvousBackend.set_state = counting_set  # type: ignore[method-assign]


class _Verdicts(logging.Handler):
    """The kit leader's verdict on a lost node (its log line) as an event: the detection."""

    def __init__(self, out: _ClientOut) -> None:
        super().__init__()
        self._out = out

    def emit(self, record: logging.LogRecord) -> None:
        if "is gone" in record.getMessage():
            self._out.emit(event="dead_seen")


def _rendezvous_handler(job: _ClientJob) -> object:
    """One node's handler of the job's design with the launcher's keep-alive; a c10d spare first waits for
    the members' first round (the kit's spare says what it is)."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    from fsdpkit.launcher import rendezvous
    from fsdpkit.launcher.rendezvous import c10d

    params = RendezvousParameters(
        backend=job.design,
        endpoint=job.endpoint,
        run_id=job.run_id,
        min_nodes=job.nodes,
        max_nodes=job.nodes,
        is_host=False,
        join_timeout=600,
    )
    if job.design == "kit":
        return rendezvous.kit_handler(
            params,
            keep_alive_s=KEEP_ALIVE["kit"][0],
            attempts=KEEP_ALIVE["kit"][1],
            spare=job.role == "spare",
        )
    interval, attempts = KEEP_ALIVE["c10d"]
    handler = c10d.c10d_handler(params, keep_alive_s=interval, attempts=attempts)
    if job.role == "spare":
        c10d.wait_for_first_round(handler, FORM_TIMEOUT_S)
    return handler


def _light_node(index: int, job: _ClientJob, out: _ClientOut, told: threading.Event) -> None:
    """What the kit's agent does with its handler, without workers: join, then every monitor interval check
    the membership, re-joining when the workers failed (`told`, once) or a node waits."""
    from fsdpkit.runtime import torch_internals as internals

    handler = _rendezvous_handler(job)
    kit = job.design == "kit"
    name = f"{job.role}{index}@{os.getpid()}"

    def join() -> None:
        called = time.time()
        info = handler.next_rendezvous()  # type: ignore[attr-defined]
        out.emit(event="joined", node=name, called=called, round=_round(handler), rank=info.rank)

    join()
    answered = False
    while True:
        time.sleep(MONITOR_S)
        if not kit:
            state = internals.state_holder(handler).state
            if len(state.participants) < job.nodes and state.complete:
                out.emit(event="member_dropped", node=name, members=len(state.participants))
        if told.is_set() and not answered:  # the workers failed: the agent re-joins
            answered = True
            join()
        elif handler.num_nodes_waiting() > 0:  # type: ignore[attr-defined]
            out.emit(event="waiting_seen", node=name)
            join()


def _client(endpoint: str, run_id: str, nodes: int, count: int, role: str, design: str) -> int:
    """Run `count` light nodes of a job of `nodes` members; print one JSON line per event on stdout."""
    import faulthandler

    job = _ClientJob(endpoint, run_id, nodes, role, design)
    out = _ClientOut()
    out.count_cas()
    logging.getLogger("kit.launch").addHandler(_Verdicts(out))
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # a stuck client's stacks, on stderr
    told = threading.Event()  # SIGUSR1: the node's workers failed (what a lost peer does to them)
    signal.signal(signal.SIGUSR1, lambda *_: told.set())
    for index in range(count):
        threading.Thread(target=_light_node, args=(index, job, out, told), daemon=True).start()
    while True:  # the CAS counters once a second; the coordinator ends the process
        time.sleep(1.0)
        with out.lock:
            sets, failed = out.sets, out.failed
        out.emit(event="cas", sets=sets, failed=failed, cpu_s=sum(os.times()[:2]))


def _round(handler: object) -> int:
    from fsdpkit.launcher.rendezvous import KitRendezvous
    from fsdpkit.runtime import torch_internals as internals

    if isinstance(handler, KitRendezvous):
        return handler.round
    return int(internals.state_holder(handler).state.round)


# --- the coordinator ----------------------------------------------------------------------------------------


@dataclass
class Process:
    popen: subprocess.Popen[str]
    role: str
    lines: queue.Queue[dict] = field(default_factory=queue.Queue)
    cas: list[dict] = field(default_factory=list)

    def start_reader(self) -> None:
        def read() -> None:
            assert self.popen.stdout is not None
            for line in self.popen.stdout:
                try:
                    item = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if item.get("event") == "cas":
                    self.cas.append(item)
                else:
                    self.lines.put(item)

        threading.Thread(target=read, daemon=True).start()


def _start(args: list[str], role: str) -> Process:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    popen = subprocess.Popen(
        [sys.executable, "-m", "bench.scale", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    process = Process(popen=popen, role=role)
    process.start_reader()
    return process


def _drain(processes: list[Process], until: float, want: Callable[[list[dict]], bool]) -> list[dict]:
    """Events from every client until `want(events)` is true or the deadline; all events read."""
    events: list[dict] = []
    while time.time() < until:
        for process in processes:
            while True:
                try:
                    events.append(process.lines.get_nowait())
                except queue.Empty:
                    break
        if want(events):
            return events
        time.sleep(0.05)
    return events


def _cas_at(processes: list[Process], ts: float) -> tuple[int, int, float]:
    """Sum over client processes of their CAS counters and CPU seconds at the report nearest `ts`."""
    sets = failed = 0
    cpu = 0.0
    for process in processes:
        if not process.cas:
            continue
        item = min(process.cas, key=lambda c: abs(c["ts"] - ts))
        sets, failed, cpu = sets + item["sets"], failed + item["failed"], cpu + item["cpu_s"]
    return sets, failed, cpu


def measure(nodes: int, design: str) -> dict[str, float]:
    """One N and one rendezvous design: formation, steady, node loss (see the module docstring)."""
    run_id = f"scale{nodes}{design}"
    processes: list[Process] = []
    with scale_launchers.store_process() as (store, endpoint):
        try:
            return _measure_on(store, endpoint, run_id, nodes, design, processes)
        finally:
            for process in processes:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.popen.pid, signal.SIGKILL)
                process.popen.wait()


def _measure_on(
    store: subprocess.Popen[str],
    endpoint: str,
    run_id: str,
    nodes: int,
    design: str,
    processes: list[Process],
) -> dict[str, float]:
    """`measure` against a running store; the client processes it starts go into `processes`."""
    common = ["--client", "--endpoint", endpoint, "--run-id", run_id, "--job-nodes", str(nodes),
              "--rendezvous", design]  # fmt: skip
    victim = _start([*common, "--count", "1", "--role", "victim"], "victim")
    processes.append(victim)
    left = nodes - 1
    while left > 0:
        count = min(NODES_PER_PROCESS, left)
        processes.append(_start([*common, "--count", str(count), "--role", "member"], "member"))
        left -= count
    processes.append(_start([*common, "--count", "1", "--role", "spare"], "spare"))

    def members_joined(events: list[dict]) -> bool:
        return sum(1 for e in events if e["event"] == "joined" and not e["node"].startswith("spare")) >= nodes

    events = _drain(processes, time.time() + FORM_TIMEOUT_S, members_joined)
    joined = [e for e in events if e["event"] == "joined"]
    if len(joined) < nodes:
        raise RuntimeError(f"N={nodes}: only {len(joined)} of {nodes} nodes formed a round")
    first_round = max(e["round"] for e in joined)
    formation_s = max(e["ts"] for e in joined) - max(e["called"] for e in joined)
    time.sleep(2.0)  # the spare parks on the redundancy list
    t0 = time.time()
    cpu0, bytes0, calls0 = scale_launchers.proc_stat(store.pid)
    events += _drain(processes, t0 + STEADY_S, lambda _: False)
    t1 = time.time()
    cpu1, bytes1, calls1 = scale_launchers.proc_stat(store.pid)
    time.sleep(1.2)  # the clients' counters of t1 arrive
    sets0, failed0, ccpu0 = _cas_at(processes, t0)
    sets1, failed1, ccpu1 = _cas_at(processes, t1)
    dropped = {e["node"] for e in events if e["event"] in ("member_dropped", "waiting_seen")}
    span = t1 - t0
    if design == "kit":  # a loss in steady training: the start-up's stalls are out of the victim's window
        time.sleep(max(0.0, max(e["ts"] for e in joined) + STALL_WINDOW_S + 1.0 - time.time()))
    os.killpg(victim.popen.pid, signal.SIGSTOP)  # a silent host: its socket open, no beat, no answer
    lost = time.time()
    if design == "kit":  # its peers' workers fail or hang: their agents re-join (c10d: they wait for
        for process in processes:  # the victim's keep-alive to expire and a spare to wait)
            if process is not victim:
                os.kill(process.popen.pid, signal.SIGUSR1)

    def reformed(events: list[dict]) -> bool:
        back = {e["node"] for e in events if e["event"] == "joined" and e["round"] > first_round}
        return len(back) >= nodes  # the survivors and the spare

    after = _drain(processes, lost + RECOVERY_TIMEOUT_S, reformed)
    seen = [e["ts"] for e in after if e["event"] == ("dead_seen" if design == "kit" else "waiting_seen")]
    back = [e["ts"] for e in after if e["event"] == "joined" and e["round"] > first_round]
    if not seen or len(back) < nodes:
        raise RuntimeError(
            f"N={nodes}: the round did not re-form with the spare within {RECOVERY_TIMEOUT_S} s"
        )
    detect_s = min(seen) - lost
    return {
        "design": design,
        "nodes": nodes,
        "formation_s": formation_s,
        "store_cpu": (cpu1 - cpu0) / span,
        "store_bytes_s": (bytes1 - bytes0) / span,
        "store_calls_s": (calls1 - calls0) / span,
        "cas_s": (sets1 - sets0) / span,
        "cas_failed": (failed1 - failed0) / max(sets1 - sets0, 1),
        "client_cpu_per_node": (ccpu1 - ccpu0) / span / (nodes + 1),
        "false_expiries": len(dropped),
        "detect_s": detect_s,
        "reform_s": max(back) - min(seen),
        "control_s": max(back) - lost,
    }


def _keep_alive_text() -> str:
    return "; ".join(
        f"{design} {interval:g} s x {attempts} = {interval * attempts:g} s"
        for design, (interval, attempts) in KEEP_ALIVE.items()
    )


def table(rows: list[dict[str, float]]) -> str:
    head = (
        "| design | N | formation s | store CPU (cores) | store MB/s | store syscalls/s | CAS writes/s "
        "| CAS failed | client CPU s/node/s | false expiries | detection s | re-forming s |"
    )
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        cells = [
            str(r["design"]),
            f"{r['nodes']}",
            f"{r['formation_s']:.2f}",
            f"{r['store_cpu']:.3f}",
            f"{r['store_bytes_s'] / 1e6:.2f}",
            f"{r['store_calls_s']:.0f}",
            f"{r['cas_s']:.0f}",
            f"{100 * r['cas_failed']:.0f} %",
            f"{r['client_cpu_per_node']:.4f}",
            f"{r['false_expiries']}",
            f"{r['detect_s']:.2f}",
            f"{r['reform_s']:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figures(rows: list[dict[str, float]]) -> dict[str, float]:
    """One design's fits and projections."""
    rows = sorted(rows, key=lambda r: r["nodes"])
    for r in rows:
        r["control_plane_s"] = r["detect_s"] + r["reform_s"]
    return {
        "nodes_light_max": max(r["nodes"] for r in rows),
        "light_formation_growth": round(growth(rows, "formation_s"), 2),
        "store_bytes_growth": round(growth(rows, "store_bytes_s"), 2),
        "store_cpu_growth": round(growth(rows, "store_cpu"), 2),
        "recovery_growth": round(growth(rows, "control_plane_s"), 2),
        "false_expiries": sum(int(r["false_expiries"]) for r in rows),
        "projected_store_cpu_1024": round(project(rows, "store_cpu", PROJECT_TO), 2),
        "projected_store_mb_s_1024": round(project(rows, "store_bytes_s", PROJECT_TO) / 1e6, 2),
        # each phase along its own fit: a power law fitted to their sum bends towards the flat one
        "projected_control_1024_s": round(
            project(rows, "detect_s", 1024) + project(rows, "reform_s", 1024), 2
        ),
    }


def launcher_figures(real: list[dict[str, float]], light: list[dict[str, float]]) -> dict[str, float]:
    """The real launchers' figures, and the whole node-loss recovery projected at 1,024 nodes: the real
    launchers' whole recovery at their largest N (the survivors' detection, the rendezvous, the workers'
    start and first step), plus what the control plane (the rendezvous' verdict + re-forming) adds from
    that N to 1,024 along the light nodes' fits. On 2 cores the workers' start grows with the CPU N
    launchers share, not with the design: an over-estimate for 1,024 hosts; NCCL's own start at 8,192 GPUs
    is not in it."""
    real = sorted(real, key=lambda r: r["nodes"])
    largest = real[-1]
    out = {
        "nodes_max": largest["nodes"],
        "formation_growth": round(growth(real, "formation_s"), 2),
        "launcher_false_expiries": sum(int(r["false_expiries"]) for r in real),
        "false_restarts": sum(int(r["false_restarts"]) for r in real),
        "beat_gap_max_s": round(max(r["beat_gap_max_s"] for r in real), 2),
    }
    if len(light) >= 2:

        def control(nodes: int) -> float:
            return sum(project(light, phase, nodes) for phase in ("detect_s", "reform_s"))

        grown = max(0.0, control(1024) - control(int(largest["nodes"])))
        out["projected_recovery_1024_s"] = round(largest["first_step_s"] + grown, 2)
    return out


def result_line(rows: list[dict[str, float]], real: list[dict[str, float]] = ()) -> str:
    """The kit design's figures (real launchers' and light nodes'); torch's c10d design's beside them with a
    `c10d_` prefix."""
    out: dict[str, float] = {}
    for design, prefix in (("kit", ""), ("c10d", "c10d_")):
        mine = [r for r in rows if r["design"] == design]
        if len(mine) >= 2:
            out.update({f"{prefix}{k}": v for k, v in figures(mine).items()})
    if len(real) >= 2:
        out.update(launcher_figures(list(real), [r for r in rows if r["design"] == "kit"]))
        out["false_expiries"] = out.get("false_expiries", 0) + out.pop("launcher_false_expiries")
    return "RESULT " + " ".join(f"{k}={v}" for k, v in out.items())


DOC = REPO / "docs" / "benchmarks" / "scale.md"


def verdict(rows: list[dict[str, float]]) -> str:
    """What one design's fitted traffic growth says about it at 1,024 nodes."""
    bytes_growth = growth(rows, "store_bytes_s")
    if bytes_growth > BYTES_GROWTH_GOAL:
        return "**does not hold at 1,024 nodes**: per-node liveness must cost O(1) bytes per beat"
    return f"grows no faster than N^{BYTES_GROWTH_GOAL}: the design holds on this count"


def section(
    rows: list[dict[str, float]],
    result: str,
    command: str,
    failures: Sequence[str] = (),
    real: Sequence[dict[str, float]] = (),
) -> str:
    """docs/benchmarks/scale.md: the table, the fits, the projections and what they say about each design."""
    rows = sorted(rows, key=lambda r: (r["design"] != "kit", r["nodes"]))
    notes = []
    for design, what in (
        ("kit", "the kit's rendezvous (training/launcher/rendezvous/kit.py, the launcher's default)"),
        ("c10d", "torch's c10d rendezvous with the kit's spares (training/launcher/rendezvous/c10d.py)"),
    ):
        mine = [r for r in rows if r["design"] == design]
        if len(mine) < 2:
            continue
        last = mine[-1]
        notes.append(
            f"- **{design}**, {what}: the store's traffic grows as N^{growth(mine, 'store_bytes_s'):.2f} and "
            f"{verdict(mine)}; projected at {PROJECT_TO} nodes: "
            f"{project(mine, 'store_bytes_s', PROJECT_TO) / 1e6:.1f} MB/s and "
            f"{project(mine, 'store_cpu', PROJECT_TO):.3f} of a core for the store's one event loop; "
            f"{100 * last['cas_failed']:.0f} % of its compare-and-set writes failed at N = {last['nodes']}."
        )
    return f"""## The control plane as the job grows (`bench.scale`)

`{command}`: for N light nodes + 1 hot spare against the kit's store process, both rendezvous designs side
by side at each N (the launcher's keep-alive: {_keep_alive_text()}): a node is a handler and the agent's
membership check every {MONITOR_S} s, no workers; the victim is SIGSTOPped (a silent host). Steady figures
over {STEADY_S:g} s of fault-free membership; store CPU and bytes from its /proc stat and io.
Detection: c10d, the first member that sees the spare waiting (the victim's keep-alive expired); kit, the
round leader's verdict on the victim's beat (the members are told at the loss that their workers failed,
as a lost peer's collective tells them, and re-join at once). Re-forming: from there to the last node in
the new round with the spare.

{table(rows)}

Fits (exponent of N, least squares on log-log) and projection to {PROJECT_TO} nodes (1,024 + 64 spares); the
kit's figures, c10d's with the prefix `c10d_`:

`{result}`

{chr(10).join(notes)}
- c10d: every beat of every node is a compare-and-set of the whole state (a pickle of every node). kit: a
  beat is one small set of the node's own key and a membership check one counter read; only a membership
  change reads O(N) (the round's leader).
- Detection does not grow in either design: c10d's is the expiry after the victim's last beat; the kit's
  is 3x the victim's own recent beat gap (at least 3 beats, at most the expiry) after its last beat.
- The clients' CPU (the machine, not the design) is printed per node; on 2 cores many light nodes slow each
  other's beats, so the largest N are the machine's limit, not the store's.
{"".join(f"- Did not complete: {f}{chr(10)}" for f in failures)}{launchers_section(list(real))}"""


def launchers_section(real: list[dict[str, float]]) -> str:
    """The real launchers' table and what it shows (docs/benchmarks/scale.md)."""
    if not real:
        return ""
    return f"""
### Real launchers (`bench/scale_launchers.py`)

N kit launchers (`python -m fsdpkit.launcher`, the kit's rendezvous, zygote workers) + 1 hot spare on this
machine, one trivial worker each (bench/scale_worker.py: an all-reduce of one number and a beat per
{scale_launchers.STEP_S:g} s step), against the kit's store process. Start-up: all launchers started at once
to the first round (the machine's cost, with its CPU seconds per node). Formation: the last member's join
call to the last member's complete round (`rdzv_round` events). Steady: {scale_launchers.STEADY_S:g} s of
training. Node loss: node N-1's launcher, zygote and worker SIGSTOPped together (a silent host); detection is
the first survivor launcher that sees its group hang (the heartbeat monitor), the round with the spare is
its last member's `rdzv_round`, the first step is rank 0's first step in the new group, each from the loss.
The longest beat gap is each node's own (the rendezvous' beat thread), from its first round to its join of
the second: how near a live node came to the expiry.

{scale_launchers.table(real)}
"""


def _sizes(parser: argparse.ArgumentParser, flag: str, text: str | None, most: int) -> list[int] | None:
    """A comma-separated list of N from the command line (None: not given; 0: none)."""
    if text is None:
        return None
    try:
        sizes = [int(n) for n in text.split(",")]
    except ValueError:
        parser.error(f"{flag} {text!r}: expected whole numbers separated by commas, e.g. 4,16")
    if sizes == [0]:
        return []
    if any(n < 2 or n > most for n in sizes):
        parser.error(f"{flag} {text!r}: each N must be in [2, {most}] (or 0 for none)")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 4, 16, 64")
    parser.add_argument(
        "--nodes", help="comma-separated N for light nodes (default 4,8,16,32,64,128; quick 4,16,64; 0: none)"
    )
    parser.add_argument(
        "--rendezvous", dest="design", choices=["both", "kit", "c10d"], default="both",
        help="the design(s) measured: the kit's (the launcher's default) and torch's c10d (default both)",
    )  # fmt: skip
    parser.add_argument(
        "--launchers",
        help="comma-separated N for real launchers with trivial workers (default 4,8,16,32; quick 4,16; "
        "0: none)",
    )
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--run-id", help=argparse.SUPPRESS)
    parser.add_argument("--job-nodes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--role", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        return _client(args.endpoint, args.run_id, args.job_nodes, args.count, args.role, args.design)
    sizes = _sizes(parser, "--nodes", args.nodes, 2048)
    if sizes is None:
        sizes = [4, 16, 64] if args.quick else [4, 8, 16, 32, 64, 128]
    launchers = _sizes(parser, "--launchers", args.launchers, 64)
    if launchers is None:
        launchers = [4, 16] if args.quick else [4, 8, 16, 32]
    designs = ["kit", "c10d"] if args.design == "both" else [args.design]
    rows, failures = [], []
    for nodes in sizes:
        for design in designs:  # side by side at each N: the same machine state for both
            try:
                row = measure(nodes, design)
            except RuntimeError as exc:  # that design did not form or re-form at this N: said, not fitted
                failures.append(f"{design}: {exc}")
                print(f"{design}: {exc}", flush=True)
                continue
            rows.append(row)
            print(
                json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}),
                flush=True,
            )
    real = []
    for nodes in launchers:
        try:
            row = scale_launchers.measure(nodes)
        except RuntimeError as exc:  # said, not fitted
            failures.append(f"{nodes} launchers: {exc}")
            print(f"{nodes} launchers: {exc}", flush=True)
            continue
        real.append(row)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    print(table(rows))
    if real:
        print(scale_launchers.table(real))
    result = result_line(rows, real)
    given = (("--nodes", args.nodes), ("--launchers", args.launchers))
    command = "python -m bench.scale" + "".join(f" {flag} {value}" for flag, value in given if value)
    if not args.quick and len(designs) == 2:
        DOC.write_text(section(rows, result, command, failures, real), encoding="utf-8")
        print(f"wrote {DOC.relative_to(REPO)}")
    kit_rows = sorted((r for r in rows if r["design"] == "kit"), key=lambda r: r["nodes"])
    if not args.quick and len(kit_rows) >= 2:  # the plan's detection and re-forming per N (ops/plan)
        keep = ("nodes", "formation_s", "detect_s", "reform_s")
        data = {"design": "kit", "rows": [{k: r[k] for k in keep} for r in kit_rows]}
        print(f"wrote {write_section('scale', data, command=command).relative_to(REPO)}")
    print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
