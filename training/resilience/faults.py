"""Fault injection (design, contract 6): real signals and real hangs, described as data.

Grammar (CLI, values file, benchmarks): a comma-separated list of `KIND:step=N:rank=R` or
`KIND:time=SECONDS:rank=R`; KIND is kill | hang | sigstop | exception | oom | slow (`slow` also takes
`factor=F`). Node-level kinds name a
node (a pod: its Job completion index, else the launcher's group rank) instead of a rank:
`node:step=N:node=K`, `freeze:step=N:node=K` or `drain:time=SECONDS:node=K`. Example:
`kill:step=20:rank=1,exception:step=45:rank=1,node:step=30:node=0`.

- kill: SIGKILL itself (a crashed process, exit -9).
- hang: the training thread stops making progress forever (sleep loop); the process stays alive.
- sigstop: SIGSTOP itself (the whole process freezes, like a wedged host process).
- exception: raises `InjectedFault` (a soft fault the in-process restart can catch).
- slow: from then on the rank computes F times slower (`slow:step=20:rank=1:factor=2`), a straggler: before
  each step's report it does (F - 1) times its own work again in real work, so its peers wait for it in the
  report's all-reduce as they would for a throttled GPU. On CPU: matrix products timed by the thread's CPU
  clock, (F - 1) x the step's compute so far; on CUDA: bf16 products on the device, counted by their time
  (measured once), (F - 1) x the rank's own GPU work of the step before, inside the window the straggler
  measure times (training/resilience/compute_timer.py). It lasts as long as the process (a restart clears
  it, as a reset clears a throttled GPU).
- oom: caps its own address space (RLIMIT_AS, current size + 256 MiB) and allocates until
  MemoryError, then dies by SIGKILL as the kernel OOM killer would (exit -9 / 137). It never uses more
  than the cap, so the machine is never exhausted.
- node: the whole pod dies at once, as when its node is lost: the launcher, the zygote and every worker
  are SIGKILLed together, with no chance to clean up (training/runtime/pod.py). Its sockets close at once, so
  its peers learn of it at once.
- freeze: the pod's node is lost silently (power, a kernel hang, a fallen GPU host): every process of the
  pod is SIGSTOPped, its sockets stay open and nothing answers; its peers only see silence. The processes
  are SIGKILLed KIT_FREEZE_KILL_S later (default 30 s: the node declared lost and its pod deleted).
- drain: the pod is asked to leave, as Kubernetes does on eviction: SIGTERM to the pod's main process,
  SIGKILL to all of it after its grace period (KIT_TERMINATION_GRACE_S, the Job's
  terminationGracePeriodSeconds). The trainer then saves the agreed step before it exits (train.py).
A node-level fault is acted on by local rank 0 of the named pod.

A step fault fires at the top of that step (`maybe_inject(step)`, before the step is computed). A time
fault fires TIME seconds after the injector is created (trainer start): kill, sigstop and oom act at
once from a timer thread (mid-step, mid-checkpoint); hang and exception need the training thread, so
they take effect at the next step boundary.

Test hook (never set in production): KIT_FAULT_TEST_IN_UPDATE, a spec of `exception` faults in the grammar
above, fires each right after the optimizer step of its step instead of at its top (`maybe_inject_in_update`),
so tests can fail a rank mid-update, where its live state is torn (resilience.state). Once per run, like a
fault (marker `<key>-in-update`). KIT_FAULT_TEST_BEFORE_REPORT: the same, fired at the top of the step's
report, after its update completed (marker `<key>-before-report`).

The study's seeded schedule (reference/seed-system.md §11) is reproduced exactly: with
`rng = random.Random(seed)`, steps = sorted(rng.sample(after+1 .. max_steps, count)); then per step in
order rank = rng.randint(1, world_size - 1) (never rank 0) and kind = rng.choices(kinds, weights).

Each fault fires once per run: before acting, the injector creates a marker file in
`<run_dir>/faults/` (O_EXCL) and emits the `fault` event, so a resumed or in-process-restarted run
never fires it again.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
import resource
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from fsdpkit.runtime import pod
from fsdpkit.runtime.events import EventLog

if TYPE_CHECKING:
    import torch

FaultKind = Literal["kill", "hang", "sigstop", "exception", "oom", "slow", "node", "freeze", "drain"]
RANK_KINDS: tuple[str, ...] = ("kill", "hang", "sigstop", "exception", "oom", "slow")
SCHEDULE_KINDS: tuple[str, ...] = ("kill", "hang", "sigstop", "exception", "oom")
"""The seeded schedule's kinds (a straggler is not a failure the study's schedule draws)."""
NODE_KINDS: tuple[str, ...] = ("node", "freeze", "drain")
KINDS: tuple[str, ...] = RANK_KINDS + NODE_KINDS
FAULTS_DIR = "faults"
TEST_IN_UPDATE_ENV = "KIT_FAULT_TEST_IN_UPDATE"
TEST_BEFORE_REPORT_ENV = "KIT_FAULT_TEST_BEFORE_REPORT"
OOM_HEADROOM_BYTES = 256 * 1024 * 1024
MAX_SLOW_FACTOR = 100.0


class FaultConfigError(ValueError):
    """A fault spec or schedule that cannot be used; the message says what to fix."""


class InjectedFault(RuntimeError):
    """The `exception` fault: a Python exception on one rank, recoverable in process."""


@dataclass(frozen=True, kw_only=True)
class Fault:
    """One planned fault: what, on which rank (or node, for node-level kinds), and when (a step or seconds
    after trainer start)."""

    kind: FaultKind
    rank: int | None = None
    step: int | None = None
    time_s: float | None = None
    node: int | None = None
    factor: float | None = None
    """`slow`: how many times slower the rank computes."""

    @property
    def target(self) -> str:
        """ "rank=R" or "node=K"."""
        return f"node={self.node}" if self.kind in NODE_KINDS else f"rank={self.rank}"

    @property
    def key(self) -> str:
        """Stable name of this fault, used for its once-per-run marker."""
        when = f"step{self.step}" if self.step is not None else f"t{self.time_s:g}"
        return f"{self.kind}-{when}-{self.target.replace('=', '')}"

    def __str__(self) -> str:
        when = f"step={self.step}" if self.step is not None else f"time={self.time_s:g}"
        factor = f":factor={self.factor:g}" if self.factor is not None else ""
        return f"{self.kind}:{when}:{self.target}{factor}"


@dataclass(frozen=True, kw_only=True)
class NodeFaultTarget:
    """Where this process sits: which pod (node index) and its local rank there."""

    node: int
    local_rank: int

    def acts_on(self, fault: Fault) -> bool:
        """A node-level fault is acted on once per pod: by local rank 0 of the named pod."""
        return fault.node == self.node and self.local_rank == 0


@dataclass(frozen=True, kw_only=True)
class FaultConfig:
    """The trainer config's `fault` section; checked when built (bad input raises FaultConfigError)."""

    spec: str = ""
    """Explicit faults, e.g. "kill:step=20:rank=1,hang:time=30:rank=1"; empty means none."""
    schedule_seed: int | None = None
    """Seed of the study's random schedule; None disables it."""
    schedule_count: int = 5
    """Number of scheduled faults."""
    schedule_kinds: str = "exception:0.6,hang:0.4"
    """Kinds with weights for the scheduled faults ("KIND:WEIGHT,..."; a bare KIND weighs 1)."""
    schedule_after_step: int = 10
    """Scheduled faults fall strictly after this step."""

    def __post_init__(self) -> None:
        parse_spec(self.spec)
        if self.schedule_seed is not None:
            parse_kinds(self.schedule_kinds)
            if self.schedule_count < 1:
                raise FaultConfigError(
                    f"fault.schedule_count must be >= 1, got {self.schedule_count}; "
                    "set it to the number of faults, or unset fault.schedule_seed"
                )
            if self.schedule_after_step < 0:
                raise FaultConfigError(
                    f"fault.schedule_after_step must be >= 0, got {self.schedule_after_step}"
                )

    def plan(self, *, world_size: int, max_steps: int) -> list[Fault]:
        """Every fault of the run (all ranks): the explicit spec plus the seeded schedule."""
        faults = parse_spec(self.spec)
        if self.schedule_seed is not None:
            faults += seeded_schedule(
                seed=self.schedule_seed,
                count=self.schedule_count,
                kinds=parse_kinds(self.schedule_kinds),
                after_step=self.schedule_after_step,
                max_steps=max_steps,
                world_size=world_size,
            )
        for fault in faults:
            if fault.rank is not None and fault.rank >= world_size:
                raise FaultConfigError(
                    f"fault {fault} targets rank {fault.rank} but the world size is {world_size}; "
                    f"use a rank below {world_size}"
                )
            if fault.step is not None and fault.step > max_steps:
                raise FaultConfigError(
                    f"fault {fault} is after the last step ({max_steps}) and would never fire; "
                    f"use a step <= {max_steps}"
                )
        return list(dict.fromkeys(faults))


_ITEM_HELP = (
    'write KIND:step=N:rank=R or KIND:time=SECONDS:rank=R, e.g. "kill:step=20:rank=1" '
    "(node, freeze and drain take node=K instead of rank=R)"
)
_INT = re.compile(r"[0-9]+")


def parse_spec(spec: str) -> list[Fault]:
    """Parse the fault grammar; raises FaultConfigError naming the bad item and the fix."""
    faults: list[Fault] = []
    for index, raw in enumerate(spec.split(","), start=1):
        item = raw.strip()
        if not item:
            if spec.strip():
                raise FaultConfigError(f"fault spec {spec!r}: item {index} is empty; remove the extra comma")
            continue
        faults.append(_parse_item(item))
    return faults


def _parse_item(item: str) -> Fault:
    kind, *fields = item.split(":")
    kind = kind.strip()
    if kind not in KINDS:
        raise FaultConfigError(f"fault {item!r}: unknown kind {kind!r}; use one of {', '.join(KINDS)}")
    values: dict[str, str] = {}
    for field in fields:
        name, sep, value = field.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not value:
            raise FaultConfigError(f"fault {item!r}: {field!r} is not NAME=VALUE; {_ITEM_HELP}")
        if name not in ("step", "time", "rank", "node", "factor"):
            raise FaultConfigError(f"fault {item!r}: unknown field {name!r}; {_ITEM_HELP}")
        if name in values:
            raise FaultConfigError(f"fault {item!r}: {name} given twice; give it once")
        values[name] = value
    who = "node" if kind in NODE_KINDS else "rank"
    other = "rank" if who == "node" else "node"
    if other in values:
        use = "node=K" if who == "node" else "rank=R"
        raise FaultConfigError(f"fault {item!r}: {kind} takes {who}=, not {other}=; write {use}")
    if who not in values:
        raise FaultConfigError(f"fault {item!r}: no {who}; {_ITEM_HELP}")
    if ("step" in values) == ("time" in values):
        raise FaultConfigError(f"fault {item!r}: give exactly one of step= or time=; {_ITEM_HELP}")
    if not _INT.fullmatch(values[who]):
        raise FaultConfigError(f"fault {item!r}: {who} must be an integer >= 0, got {values[who]!r}")
    target: dict[str, float] = {who: int(values[who])}
    if ("factor" in values) != (kind == "slow"):
        problem = "needs factor=F (how many times slower, e.g. 2)" if kind == "slow" else "takes no factor="
        raise FaultConfigError(f"fault {item!r}: {kind} {problem}")
    if kind == "slow":
        try:
            factor = float(values["factor"])
        except ValueError:
            factor = math.nan
        if not (1.0 < factor <= MAX_SLOW_FACTOR):
            raise FaultConfigError(
                f"fault {item!r}: factor must be a number > 1 and <= {MAX_SLOW_FACTOR:g} (times slower), "
                f"got {values['factor']!r}"
            )
        target["factor"] = factor
    if "step" in values:
        if not _INT.fullmatch(values["step"]) or int(values["step"]) < 1:
            raise FaultConfigError(f"fault {item!r}: step must be an integer >= 1, got {values['step']!r}")
        return Fault(kind=kind, step=int(values["step"]), **target)  # type: ignore[arg-type]
    try:
        time_s = float(values["time"])
    except ValueError:
        time_s = -1.0
    if not time_s > 0 or time_s == float("inf"):
        raise FaultConfigError(
            f"fault {item!r}: time must be seconds > 0 after trainer start, got {values['time']!r}"
        )
    return Fault(kind=kind, time_s=time_s, **target)  # type: ignore[arg-type]


def parse_kinds(kinds: str) -> list[tuple[FaultKind, float]]:
    """Parse "exception:0.6,hang:0.4" into (kind, weight) pairs, in the given order."""
    pairs: list[tuple[FaultKind, float]] = []
    for raw in kinds.split(","):
        kind, sep, weight_text = raw.strip().partition(":")
        if kind not in SCHEDULE_KINDS:
            raise FaultConfigError(
                f"fault.schedule_kinds {kinds!r}: unknown kind {kind!r}; use one of "
                f"{', '.join(SCHEDULE_KINDS)} (the seeded schedule targets ranks; give node-level and slow "
                "faults in fault.spec)"
            )
        try:
            weight = float(weight_text) if sep else 1.0
        except ValueError:
            weight = -1.0
        if not weight > 0:
            raise FaultConfigError(
                f"fault.schedule_kinds {kinds!r}: weight of {kind!r} must be a number > 0, "
                f"got {weight_text!r}"
            )
        pairs.append((kind, weight))  # type: ignore[arg-type]
    return pairs


def seeded_schedule(
    *,
    seed: int,
    count: int,
    kinds: list[tuple[FaultKind, float]],
    after_step: int,
    max_steps: int,
    world_size: int,
) -> list[Fault]:
    """The study's deterministic schedule (S/src/failure_simulator.py), identical on every rank."""
    if world_size < 2:
        raise FaultConfigError(
            "the seeded fault schedule never targets rank 0, so it needs a world size >= 2; "
            "unset fault.schedule_seed or run more ranks"
        )
    eligible = list(range(after_step + 1, max_steps + 1))
    if count > len(eligible):
        raise FaultConfigError(
            f"fault.schedule_count={count} but only {len(eligible)} steps lie after "
            f"fault.schedule_after_step={after_step} up to training.steps={max_steps}; lower the count"
        )
    rng = random.Random(seed)
    steps = sorted(rng.sample(eligible, count))
    names = [kind for kind, _ in kinds]
    weights = [weight for _, weight in kinds]
    faults = []
    for step in steps:
        rank = rng.randint(1, world_size - 1)
        kind = rng.choices(names, weights)[0]
        faults.append(Fault(kind=kind, rank=rank, step=step))
    return faults


class FaultInjector:
    """Applies the faults meant for this rank; each fires once per run, even across restarts."""

    def __init__(
        self,
        cfg: FaultConfig,
        *,
        rank: int,
        world_size: int,
        max_steps: int,
        events: EventLog,
        run_dir: str | os.PathLike[str] | None = None,
        local_rank: int = 0,
        node: int | None = None,
    ) -> None:
        self.cfg = cfg
        self.rank = rank
        self._events = events
        plan = cfg.plan(world_size=world_size, max_steps=max_steps)
        self._plan = plan
        here = NodeFaultTarget(node=pod.pod_index() if node is None else node, local_rank=local_rank)
        self._faults = [f for f in plan if (f.rank == rank if f.node is None else here.acts_on(f))]
        self._by_step = {f.step: f for f in self._faults if f.step is not None}
        self._in_update = {f.step: f for f in _test_faults(TEST_IN_UPDATE_ENV) if f.rank == rank}
        self._before_report = {f.step: f for f in _test_faults(TEST_BEFORE_REPORT_ENV) if f.rank == rank}
        self._marker_dir = Path(run_dir) / FAULTS_DIR if run_dir is not None else None
        self._fired: set[str] = set()
        self._due: list[Fault] = []
        self._lock = threading.Lock()
        self._step: int | None = None
        self.slow_factor = 1.0
        """Above 1 once a `slow` fault fired on this rank: its compute is that many times slower."""
        self._timers = [
            threading.Timer(f.time_s, self._on_timer, args=(f,))
            for f in self._faults
            if f.time_s is not None and not self._already_fired(f)
        ]
        for timer in self._timers:
            timer.daemon = True
            timer.start()

    @property
    def faults(self) -> list[Fault]:
        """The faults planned for this rank."""
        return list(self._faults)

    def maybe_inject(self, step: int) -> None:
        """Called at the top of every training step; acts when a fault for (step, this rank) is due."""
        self._step = step
        with self._lock:
            due, self._due = self._due, []
        fault = self._by_step.get(step)
        if fault is not None:
            due.append(fault)
        for item in due:
            if self._claim(item):
                self._act(item)

    def maybe_inject_in_update(self, step: int) -> None:
        """Called right after the optimizer step of every training step: the test hook's faults."""
        fault = self._in_update.get(step)
        if fault is not None and self._claim(fault, key=f"{fault.key}-in-update", where="update"):
            self._act(fault)

    def maybe_inject_before_report(self, step: int) -> None:
        """Called at the top of every step's report (its update complete): the test hook's faults."""
        fault = self._before_report.get(step)
        if fault is not None and self._claim(fault, key=f"{fault.key}-before-report", where="report"):
            self._act(fault)

    def unfired(self) -> list[Fault]:
        """The run's planned faults (every rank and node) that never fired: no marker in the run folder
        (without a run folder: this rank's own that this process did not fire). Read at the end of a run,
        so a report never counts a planned fault that did not happen as recovered."""
        if self._marker_dir is None:
            return [f for f in self._faults if f.key not in self._fired]
        return [f for f in self._plan if not (self._marker_dir / f.key).exists()]

    def slow_down(self, compute_s: float, device: torch.device | None = None) -> None:
        """With a `slow` fault fired: (factor - 1) x `compute_s` of real work more (a slower GPU), on `device`
        (the rank's; CPU when None)."""
        if self.slow_factor > 1.0 and compute_s > 0:
            seconds = (self.slow_factor - 1.0) * compute_s
            if device is not None and device.type == "cuda":
                _burn_cuda(seconds, device)
            else:
                _burn(seconds)

    def close(self) -> None:
        """Stops the timer of time-based faults."""
        for timer in self._timers:
            timer.cancel()

    def _on_timer(self, fault: Fault) -> None:
        if fault.kind in ("hang", "exception"):
            with self._lock:
                self._due.append(fault)  # needs the training thread: next step boundary
        elif self._claim(fault):
            self._act(fault)

    def _already_fired(self, fault: Fault) -> bool:
        if fault.key in self._fired:
            return True
        return self._marker_dir is not None and (self._marker_dir / fault.key).exists()

    def _claim(self, fault: Fault, *, key: str | None = None, **extra: object) -> bool:
        """Record the fault as fired, exactly once per run (the marker outlives this process)."""
        key = key or fault.key
        with self._lock:
            if key in self._fired:
                return False
            self._fired.add(key)
        if self._marker_dir is not None:
            self._marker_dir.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self._marker_dir / key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            os.write(fd, f"{time.time():.6f} pid={os.getpid()} step={self._step}\n".encode())
            os.fsync(fd)
            os.close(fd)
        step = fault.step if fault.step is not None else self._step
        target = {"target_node": fault.node} if fault.node is not None else {"target_rank": fault.rank}
        self._events.emit("fault", fault=fault.kind, step=step, **target, **extra)
        return True

    def _act(self, fault: Fault) -> None:
        if fault.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault.kind == "sigstop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif fault.kind == "hang":
            while True:  # the training thread never comes back; the process stays alive
                time.sleep(3600)
        elif fault.kind == "exception":
            raise InjectedFault(f"injected fault {fault} (rank {self.rank})")
        elif fault.kind == "oom":
            _die_of_oom()
        elif fault.kind == "slow":
            self.slow_factor = float(fault.factor or 1.0)
        elif fault.kind == "node":
            pod.kill_pod()
        elif fault.kind == "freeze":
            pod.freeze_pod(pod.freeze_kill_s())
        elif fault.kind == "drain":
            pod.drain_pod(pod.grace_period_s())


def _burn(seconds: float) -> None:
    """`seconds` of this thread's CPU in matrix products: work a slow device would have done."""
    import torch

    a = torch.ones(96, 96)
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        a = torch.mm(a, a).clamp_(max=1.0)


_CUDA_PRODUCT_S: dict[torch.device, float] = {}
"""Seconds of one `_burn_cuda` product per device, measured once (the slow rank's first slowed step)."""
BURN_N = 2048


def _burn_cuda(seconds: float, device: torch.device) -> None:
    """`seconds` of the device's work in bf16 matrix products on the current stream, mirroring `_burn`: the
    host only queues them (the count from their measured time), the GPU takes that much longer."""
    import torch

    a = torch.ones(BURN_N, BURN_N, device=device, dtype=torch.bfloat16)
    out = torch.empty_like(a)
    if device not in _CUDA_PRODUCT_S:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.mm(a, a, out=out)  # warm-up: the first product pays the kernel's selection
        start.record()
        for _ in range(16):
            torch.mm(a, a, out=out)
        end.record()
        end.synchronize()
        _CUDA_PRODUCT_S[device] = max(start.elapsed_time(end) / 1000.0 / 16, 1e-6)
    for _ in range(round(seconds / _CUDA_PRODUCT_S[device])):
        torch.mm(a, a, out=out)


def _test_faults(name: str) -> list[Fault]:
    """A test hook's faults (`name`: KIT_FAULT_TEST_IN_UPDATE or KIT_FAULT_TEST_BEFORE_REPORT);
    FaultConfigError (one line) for anything but step exceptions."""
    faults = parse_spec(os.environ.get(name, ""))
    for f in faults:
        if f.kind != "exception" or f.step is None:
            raise FaultConfigError(f"{name}: {f} is not exception:step=N:rank=R")
    return faults


def _die_of_oom() -> None:
    """Hit a self-imposed memory limit, then die the way the kernel OOM killer kills (SIGKILL)."""
    with open("/proc/self/statm", encoding="ascii") as fh:
        size_bytes = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = size_bytes + OOM_HEADROOM_BYTES
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    hoard = []
    with contextlib.suppress(MemoryError):
        while True:
            hoard.append(bytearray(16 * 1024 * 1024))
    os.kill(os.getpid(), signal.SIGKILL)
