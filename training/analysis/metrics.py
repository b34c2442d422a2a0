"""The design's metrics, computed after the fact from a run's events (design, contract 3).

One module owns every definition, so the report, the benchmarks and the cost report agree. Nothing here runs
inside the training loop: the loop only writes events (`fsdpkit.runtime.events`).

Conventions, chosen once and documented here:
- Per-rank sums (step time, checkpoint stalls, drain) are read from the *reference rank*, the lowest trainer
  rank that wrote events (rank 0 in practice). Ranks step in lock-step through collectives, so a stall on any
  rank shows up on rank 0 too; summing over ranks would count the same wall time once per rank. The study
  measures on rank 0 as well (reference/seed-system.md §10).
- A fault's matching resume is the first `resume` or `inprocess_restart` event (any rank) after the fault's
  timestamp. Its recovery ends when every rank that resumed has finished its first step after resuming.
- Timestamps are wall-clock seconds from the events; processes on one host share the clock.
- Robust input: several processes, restarts (the `attempt` field), torn last lines (skipped by
  `read_events`), runs with no faults, no checkpoints, or no `end` event (a run that died).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fsdpkit.runtime.events import events_dir

Event = Mapping[str, Any]

DETECTION_KINDS = ("worker_failed", "hang_detected", "peer_gone")
"""Launcher events that mean "the launcher noticed a fault"."""
RESUME_KINDS = ("resume", "inprocess_restart")
RESTORE_SOURCES = ("none", "live", "replica", "memory", "peer", "shared")
"""Where a resume found its state, from the cheapest to the dearest: none (from the seed), live (the failed
session's own tensors), replica (a live replica's, sent over the network: HSDP), memory (the node's
memory: a host copy or the node tier), peer (another node's memory), shared (the shared checkpoint
folder)."""


def restore_source(sources: Iterable[Any]) -> str | None:
    """The job's source for one restore: the dearest any rank used (the job waits for its slowest rank).
    Runs from before the memory tiers wrote "disk" for shared storage."""
    seen = ["shared" if s == "disk" else s for s in sources if s in (*RESTORE_SOURCES, "disk")]
    return max(seen, key=RESTORE_SOURCES.index) if seen else None


"""Trainer events that mean "training state was restored after a (re)start"."""


class MetricsError(ValueError):
    """A run folder or event stream that cannot give metrics; the message says what to fix."""


@dataclass(frozen=True, kw_only=True)
class FaultMetrics:
    """One injected fault and what it cost (seconds are wall-clock, from the events)."""

    kind: str
    """Fault kind as injected: kill, hang, sigstop, exception, oom (rank kinds) or node, freeze, drain (node
    kinds); `slow` fails nothing and is reported under `stragglers` instead (NOT_FAILURES)."""
    step: int | None
    """Training step at which the fault fired."""
    rank: int | None
    """Global rank the fault targeted."""
    ts: float
    """Unix time the injector wrote just before acting, in seconds."""
    detect_s: float | None
    """Seconds from the fault to the launcher's detection (`worker_failed`, `hang_detected` or `peer_gone`:
    DETECTION_KINDS) or to the start of the in-process restart; None when nothing detected it."""
    recovery_s: float | None
    """Seconds from the fault to the end of the first training step after the matching resume; None if the run
    never resumed."""
    detected_by: str | None = None
    """`worker_failed`, `hang_detected`, `peer_gone` (a silent node's beat), `inprocess` or None."""
    blamed_rank: int | None = None
    """The rank the launcher named as the first to fail (None for in-process or undetected faults)."""
    downtime_s: float | None = None
    """Seconds from the fault until training restarted (start of the first step after the resume): the study's
    shutdown + startup, used by infra goodput."""
    resume_step: int | None = None
    """Checkpoint step the run resumed from (None: from scratch or never resumed)."""
    resume_source: str | None = None
    """Where the state came from (`restore_source` of every rank's resume): live, memory, peer, shared or
    none."""
    restore_s: float | None = None
    """Seconds the slowest rank spent restoring (its resume event's duration); None if never resumed."""
    restore_bytes: int | None = None
    """Bytes every rank restored from a memory tier or read from shared storage, summed."""
    shared_bytes: int | None = None
    """Bytes every rank read from the shared checkpoint folder during the restore, summed (0: none)."""
    lost_steps: int | None = None
    """Steps computed before the fault that were computed again (highest step before it - resume step)."""
    node: int | None = None
    """Pod (node index) a node-level fault (`node`, `freeze`, `drain`) targeted; None for rank-level kinds."""
    takeover: str | None = None
    """Who trained in the lost node's place: "spare" (a launcher already waiting before the fault),
    "replacement" (a launcher started after it: the Job's new pod) or "same nodes"; None when no group
    started after it."""


NOT_FAILURES = ("slow",)
"""Fault kinds that fail nothing (a straggler): no recovery to measure; `stragglers` reports them."""


@dataclass(frozen=True, kw_only=True)
class StragglerMetrics:
    """A straggler the ranks confirmed (its `straggler` event) and what it cost."""

    rank: int
    node: int
    score: float
    """How many times slower its compute was than its peers' median, when confirmed."""
    since_step: int
    step: int
    """The step at which it was confirmed."""
    lost_s: float
    """The step time beyond the median step before it, over the steps from `since_step` on (rank 0's steps:
    every rank waits for the straggler)."""
    evicted: bool


UNFIRED = "fault_unfired"
"""The trainer's event for a planned fault that never fired (fsdpkit.resilience.job: `Job.finish`)."""


@dataclass(frozen=True)
class WorldSpan:
    """A stretch of the run at one world size (an elastic run has several; each resharded resume starts
    one at its workers' start)."""

    world_size: int
    start_s: float
    """Seconds after the run's first trainer start."""
    duration_s: float
    steps: int
    """Steps the reference rank computed in it, replays included."""

    @property
    def rank_hours(self) -> float:
        """Ranks (GPUs) x hours: what the span cost in GPU time."""
        return self.world_size * self.duration_s / 3600


@dataclass(frozen=True, kw_only=True)
class RunMetrics:
    """The design's metrics for one run (ops' cost report reads these fields)."""

    world_size: int
    """Number of trainer ranks (from the `start` events)."""
    spare_nodes: int = 0
    """Hot spare pods the job ran beside its training nodes (launcher `launcher_start` events): their
    nodes are paid for while they wait, so the cost report counts them."""
    training_nodes: int = 0
    """Training nodes (pods) of the job, from the kit launcher's `launcher_start` events; 0 when no kit
    launcher wrote one (torchrun, ft_launcher). world_size / training_nodes is the GPUs of one node."""
    wall_s: float
    """Seconds from the first trainer start to the last trainer end (or last event if the run never ended)."""
    steps_completed: int
    """Steps in the final result (the final step)."""
    steps_computed: int
    """Step executions on the reference rank, replays after resumes included."""
    lost_steps: int
    """steps_computed - steps_completed: work done again after faults."""
    median_step_s: float
    """Median step time in seconds over fault-free steps (first step of each process and after each restart
    excluded)."""
    stall_s: float
    """Seconds the training loop was blocked by checkpoint calls (reference rank), final drain excluded."""
    drain_s: float
    """Seconds spent waiting for the last background save at exit (reported separately, as in the study)."""
    efficiency: float
    """The study's checkpoint efficiency: 1 - stall_s / wall_s."""
    checkpoints_committed: int
    """Checkpoints whose commit record was written."""
    checkpoints_failed: int
    """Checkpoint saves that failed (disk full, permission denied, ...); training went on."""
    faults: list[FaultMetrics] = field(default_factory=list)
    """Every injected fault, in time order."""
    recovery_s_total: float = 0.0
    """Sum of the faults' recovery_s (faults never recovered count 0)."""
    downtime_s_total: float = 0.0
    """Sum of the faults' downtime_s (the study's shutdown + startup; faults never recovered count 0)."""
    step_time_s: float = 0.0
    """Seconds the reference rank spent inside training steps, replays included (checkpoints excluded)."""
    startup_s: float = 0.0
    """Seconds from the first trainer start to the start of the reference rank's first step (process group,
    model, checkpoint load); 0 when no step ran."""
    goodput: float = 0.0
    """Strict goodput: steps_completed * median_step_s / wall_s."""
    training_goodput: float = 0.0
    """Study's training goodput (seed-system.md §10): time spent in training steps, replays included,
    checkpoint time excluded, over wall time."""
    infra_goodput: float = 0.0
    """Study's infra goodput: (wall - sum of per-fault shutdown + startup) / wall."""
    finished: bool = False
    """True when a trainer wrote its `end` event."""
    outcome: str = ""
    """How the run ended, as its exit status says it: "finished", or "failed: exit N: <the launcher's reason>"
    (the first launcher that exited non-zero), or "unfinished" when nothing says why."""
    attempts: int = 1
    """Worker-group attempts seen (the launcher's restart count + 1)."""
    restarts: int = 0
    """Worker-group restarts the launcher made."""
    inprocess_restarts: int = 0
    """In-process restarts (counted once per restart, not per rank)."""
    faults_recovered: int = 0
    """Faults followed by a resume and a completed step."""
    restores: dict[str, int] = field(default_factory=dict)
    """Faults by where their restore found the state (`FaultMetrics.resume_source`): live, memory, peer,
    shared, none."""
    faults_unfired: list[str] = field(default_factory=list)
    """Planned faults that never fired (`fault_unfired` events at the end of the run, in the fault grammar):
    the run does not prove their recovery, and the report says so."""
    stragglers: list[StragglerMetrics] = field(default_factory=list)
    """Stragglers the ranks confirmed, and the wall time each cost."""
    checkpoint_write_s: float = 0.0
    """Seconds of background writing (async) on the reference rank; overlaps training, not a stall."""
    events_skipped: int = 0
    """Events left out because a field the metrics need was missing or not a number."""
    tokens_per_s: float | None = None
    """Median tokens per second of one rank (one GPU) over its steps; None when steps carry none."""
    world_spans: list[WorldSpan] = field(default_factory=list)
    """The run's stretches at one world size, in time order: one for a fixed-size run, several when it
    shrank or grew (elastic); a rank-hours figure each."""
    reshards: int = 0
    """Resumes onto another world size (the reference rank's `resharded` events)."""
    mfu: float | None = None
    """Median model FLOPs utilisation over the same steps; None where the device's peak is unknown (CPU)."""


@dataclass(frozen=True, kw_only=True)
class Goodput:
    """The three goodputs of one run over one wall time (fractions in [0, 1] for a sane run)."""

    strict: float
    """steps_completed * median_step_s / wall: only the steps in the final result, at fault-free speed."""
    training: float
    """The study's training goodput: step_time_s / wall."""
    infra: float
    """The study's infra goodput: (wall - downtime_s_total) / wall."""


def goodput_over(m: RunMetrics, wall_s: float) -> Goodput:
    """The goodputs of `m` over `wall_s` seconds. compute_metrics uses the events' wall (first trainer start
    to last end); a benchmark passes the job's wall time from its own clock (launch to exit), so the
    launcher's and the workers' start-up count too, as a user waiting for the job sees them."""
    return Goodput(
        strict=_ratio(m.steps_completed * m.median_step_s, wall_s),
        training=_ratio(m.step_time_s, wall_s),
        infra=_ratio(wall_s - m.downtime_s_total, wall_s),
    )


@dataclass(frozen=True, kw_only=True)
class TimeBudget:
    """Where a job's wall time went, in seconds; the parts add up to `wall_s` (`other_s` is the rest)."""

    wall_s: float
    useful_s: float
    """steps_completed * median_step_s: what strict goodput counts."""
    replay_s: float
    """lost_steps * median_step_s: steps computed again after faults."""
    slow_steps_s: float
    """step_time_s beyond steps_computed * median_step_s: steps slower than the median (the first step of a
    process, steps beside a background checkpoint write)."""
    checkpoint_s: float
    """stall_s + drain_s: the loop blocked by saves, and the final wait."""
    downtime_s: float
    """downtime_s_total: per fault, the fault until training restarted."""
    startup_s: float
    """startup_s: the first trainer start to its first step."""
    outside_s: float
    """The job's wall time outside the events' wall: launcher and worker start-up before the first trainer
    start, and the exit after the last end."""
    other_s: float
    """The rest (between steps: heartbeats, events, logs; time the events do not attribute)."""


def time_budget(m: RunMetrics, wall_s: float) -> TimeBudget:
    """Split `wall_s` (the job's wall time, >= m.wall_s) into the parts of TimeBudget."""
    parts = {
        "useful_s": m.steps_completed * m.median_step_s,
        "replay_s": m.lost_steps * m.median_step_s,
        "slow_steps_s": m.step_time_s - m.steps_computed * m.median_step_s,
        "checkpoint_s": m.stall_s + m.drain_s,
        "downtime_s": m.downtime_s_total,
        "startup_s": m.startup_s,
        "outside_s": max(0.0, wall_s - m.wall_s),
    }
    return TimeBudget(wall_s=wall_s, other_s=wall_s - sum(parts.values()), **parts)


def _world_spans(mine: Sequence[Event], t_first: float, t_last: float) -> list[WorldSpan]:
    """The reference rank's starts cut the run into stretches of one world size (equal neighbours merged)."""
    starts = [e for e in mine if e["kind"] == "start"]
    steps = [_ts(e) for e in mine if e["kind"] == "step"]
    spans: list[WorldSpan] = []
    for i, start in enumerate(starts):
        begin = _ts(start) if spans else t_first
        end = _ts(starts[i + 1]) if i + 1 < len(starts) else max(t_last, begin)
        size = int(start.get("world_size") or 0)
        count = sum(1 for t in steps if begin <= t < end or (i + 1 == len(starts) and t == end))
        if spans and spans[-1].world_size == size:
            last = spans.pop()
            begin, count = t_first + last.start_s, count + last.steps
        spans.append(WorldSpan(size, begin - t_first, end - begin, count))
    return spans


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _ts(event: Event) -> float:
    return float(event["ts"])


def _is_trainer(event: Event) -> bool:
    return event.get("role") == "trainer" and event.get("rank") is not None


def _fault_free_durations(events: Sequence[Event], rank: int) -> list[float]:
    """Step times of `rank` without the first step of each process and the first after an in-process restart.

    A rank has one live process at a time, so its `start` events delimit process lifetimes.
    """
    durations: list[float] = []
    warm = False
    for e in events:
        if not _is_trainer(e) or int(e["rank"]) != rank:
            continue
        if e["kind"] in ("start", "inprocess_restart"):
            warm = False
        elif e["kind"] == "step":
            if warm:
                durations.append(float(e.get("duration_s") or 0.0))
            warm = True
    return durations


def _process(e: Event) -> tuple[Any, Any]:
    """One process of the run: pids repeat across hosts (each pod has its own pid namespace)."""
    return e.get("host"), e.get("pid")


def _first_step_after(events: Sequence[Event], rank: int, after_ts: float) -> Event | None:
    for e in events:
        if e["kind"] == "step" and _is_trainer(e) and int(e["rank"]) == rank and _ts(e) > after_ts:
            return e
    return None


def _fault_metrics(events: Sequence[Event], fault: Event, until: float = float("inf")) -> FaultMetrics:
    """`until`: the next fault's time; what happens from then on is that fault's."""
    t0 = _ts(fault)
    resumes = [e for e in events if e["kind"] in RESUME_KINDS and _is_trainer(e) and _ts(e) >= t0]
    first_resume = resumes[0] if resumes else None
    per_rank = _resumes_per_rank(events, resumes, until)
    recovery_end, restart_begin = _recovery_end(events, per_rank)
    horizon = _ts(first_resume) if first_resume is not None else float("inf")
    detect_s, detected_by, blamed = _detection(events, resumes, t0, horizon, recovery_end)
    resume_step, lost = _resume_point(events, first_resume, t0)
    target = fault.get("target_rank", fault.get("rank"))
    node = _int(fault.get("target_node"))
    return FaultMetrics(
        node=node,
        takeover=_takeover(events, t0, until),
        kind=str(fault.get("fault", "unknown")),
        step=_int(fault.get("step")),
        rank=None if node is not None else _int(target),
        ts=t0,
        detect_s=detect_s,
        recovery_s=None if recovery_end is None else recovery_end - t0,
        detected_by=detected_by,
        blamed_rank=blamed,
        downtime_s=None if restart_begin is None else max(0.0, restart_begin - t0),
        resume_step=resume_step,
        resume_source=restore_source(e.get("source") for e in per_rank.values()),
        restore_s=max((float(e.get("duration_s") or 0.0) for e in per_rank.values()), default=None),
        restore_bytes=_total(per_rank.values(), "bytes"),
        shared_bytes=_total(per_rank.values(), "shared_bytes"),
        lost_steps=lost,
    )


def _resumes_per_rank(events: Sequence[Event], resumes: Sequence[Event], until: float) -> dict[int, Event]:
    """Every rank's first resume of the same kind as the first one after the fault, before the next fault.

    A rank on a replacement node has a launcher of its own, so its attempt count starts again at 0. Only the
    world the first resume formed counts: an elastic job that shrank resumes the lost rank only when it
    grows back, a membership change of its own, not this fault's recovery."""
    worlds = {_process(e): e.get("world_size") for e in events if e["kind"] == "start" and _is_trainer(e)}
    per_rank: dict[int, Event] = {}
    if resumes:
        first_resume = resumes[0]
        world = worlds.get(_process(first_resume))
        for e in resumes:
            if e["kind"] == first_resume["kind"] and _ts(e) < until and worlds.get(_process(e)) == world:
                per_rank.setdefault(int(e["rank"]), e)
    return per_rank


def _recovery_end(
    events: Sequence[Event], per_rank: Mapping[int, Event]
) -> tuple[float | None, float | None]:
    """(end, start) of the last first step after a resume over the ranks; both None when a rank that resumed
    never finished a step."""
    recovery_end: float | None = None
    restart_begin: float | None = None
    for rank, resume in per_rank.items():
        step = _first_step_after(events, rank, _ts(resume))
        if step is None:
            return None, None
        end = _ts(step)
        begin = float(step.get("t_start") or end - float(step.get("duration_s") or 0.0))
        recovery_end = end if recovery_end is None else max(recovery_end, end)
        restart_begin = begin if restart_begin is None else max(restart_begin, begin)
    return recovery_end, restart_begin


def _detection(
    events: Sequence[Event], resumes: Sequence[Event], t0: float, horizon: float, recovery_end: float | None
) -> tuple[float | None, str | None, int | None]:
    """(seconds from the fault to its detection, what detected it, the rank the launcher blamed)."""
    detections = [
        e
        for e in events
        if e.get("role") == "launcher" and e["kind"] in DETECTION_KINDS and t0 <= _ts(e) <= horizon
    ]
    # The launcher marks the rank that failed first (`first`); its peers' failures follow it.
    detection = next((e for e in detections if e.get("first", True)), detections[0] if detections else None)
    if detection is not None:
        return _ts(detection) - t0, str(detection["kind"]), _int(detection.get("global_rank"))
    # In-process: the restart began (ts - duration_s of its `inprocess_restart` event, which may come
    # after the `resume` it contains) within this fault's recovery.
    window_end = recovery_end if recovery_end is not None else horizon
    began = [
        _ts(e) - float(e.get("duration_s") or 0.0)
        for e in resumes
        if e["kind"] == "inprocess_restart" and _ts(e) <= window_end
    ]
    if began:
        return max(0.0, min(began) - t0), "inprocess", None
    return None, None, None


def _resume_point(
    events: Sequence[Event], first_resume: Event | None, t0: float
) -> tuple[int | None, int | None]:
    """(the step training resumed from, the steps done before the fault that were lost)."""
    if first_resume is None:
        return None, None
    key = "restored_step" if first_resume["kind"] == "inprocess_restart" else "step"
    resume_step = _int(first_resume.get(key))
    before = [int(e["step"]) for e in events if e["kind"] == "step" and _is_trainer(e) and _ts(e) <= t0]
    lost = max(0, max(before) - (resume_step or 0)) if before else None
    return resume_step, lost


def _total(events: Iterable[Event], key: str) -> int | None:
    """Sum of an integer field over events that carry it; None if none does."""
    values = [int(e[key]) for e in events if isinstance(e.get(key), int) and not isinstance(e.get(key), bool)]
    return sum(values) if values else None


def _takeover(events: Sequence[Event], t0: float, until: float) -> str | None:
    """Classify the launchers whose worker groups start after the fault and before the next one at `until`
    (see FaultMetrics.takeover)."""
    launchers = [e for e in events if e.get("role") == "launcher"]
    rounds = [e for e in launchers if e["kind"] == "rdzv_round" and _ts(e) < until]
    before = [int(e.get("world") or 0) for e in rounds if _ts(e) < t0]
    after_round = next((int(e.get("world") or 0) for e in rounds if _ts(e) >= t0), None)
    if before and after_round is not None and after_round < before[-1]:
        return f"none (shrank to {after_round} nodes)"
    born: dict[tuple[Any, Any], float] = {}
    trained_before: set[tuple[Any, Any]] = set()
    for e in launchers:
        born.setdefault(_process(e), _ts(e))
        if e["kind"] == "group_started" and _ts(e) < t0:
            trained_before.add(_process(e))
    after = [e for e in launchers if e["kind"] == "group_started" and t0 <= _ts(e) < until]
    if not after:
        return None
    newcomers = {_process(e) for e in after} - trained_before
    if not newcomers:
        return "same nodes"
    return "spare" if any(born[k] < t0 for k in newcomers) else "replacement"


def _unique_faults(events: Sequence[Event]) -> list[Event]:
    """One event per fault even if several ranks' injectors logged it."""
    seen: set[tuple[Any, ...]] = set()
    out: list[Event] = []
    for e in events:
        if e["kind"] != "fault" or e.get("fault") in NOT_FAILURES:
            continue
        target = e.get("target_node", e.get("target_rank", e.get("rank")))
        key = (e.get("fault"), e.get("step"), target, e.get("attempt"))
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def _stragglers(events: Sequence[Event], steps: Sequence[Event]) -> list[StragglerMetrics]:
    out = []
    for e in events:
        if e["kind"] != "straggler" or not _is_trainer(e):
            continue
        since = int(e.get("since_step") or e["step"])
        before = [float(s.get("duration_s") or 0.0) for s in steps if int(s["step"]) < since - 4]
        base = statistics.median(before) if before else 0.0
        lost = sum(
            max(0.0, float(s.get("duration_s") or 0.0) - base) for s in steps if int(s["step"]) >= since
        )
        out.append(
            StragglerMetrics(
                rank=int(e["target_rank"]),
                node=int(e["target_node"]),
                score=float(e["score"]),
                since_step=since,
                step=int(e["step"]),
                lost_s=lost if before else 0.0,
                evicted=bool(e.get("evict")),
            )
        )
    return out


_NEEDS: dict[str, tuple[str, ...]] = {"step": ("step",), "end": ("step",), "ckpt": ("phase",)}
"""Fields a kind must carry to be counted (beyond ts and kind); the step number must be an integer."""


def _well_formed(e: Any) -> bool:
    """True for a mapping with a numeric ts, a kind, an integer rank (trainers) and the kind's fields."""
    if not isinstance(e, Mapping) or not isinstance(e.get("kind"), str):
        return False
    try:
        float(e["ts"])
        if e.get("role") == "trainer" and e.get("rank") is not None:
            int(e["rank"])
        if e["kind"] in ("step", "end"):
            int(e["step"])
    except (KeyError, TypeError, ValueError):
        return False
    return all(key in e for key in _NEEDS.get(e["kind"], ()))


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


@dataclass(frozen=True, kw_only=True)
class _Steps:
    """The reference rank's steps: how many ran, how many the result kept, how long they took."""

    computed: int
    completed: int
    median_s: float
    startup_s: float
    time_s: float
    tokens_per_s: float | None
    mfu: float | None


def _step_figures(
    evs: Sequence[Event], ref: int, steps: Sequence[Event], ends: Sequence[Event], t_first: float
) -> _Steps:
    """`steps`: the reference rank's `step` events; `ends`: every trainer's `end` event."""
    startup_s = 0.0
    if steps:
        first = steps[0]
        startup_s = max(0.0, float(first.get("t_start") or _ts(first)) - t_first)
    final = max((int(e["step"]) for e in ends), default=None)
    # Count distinct step numbers up to the final one, so 0- and 1-based numbering give the same answer.
    distinct = {int(e["step"]) for e in steps if final is None or int(e["step"]) <= final}
    durations = _fault_free_durations(evs, ref) or [float(e.get("duration_s") or 0.0) for e in steps]
    rates = [float(e["tokens_per_s"]) for e in steps if isinstance(e.get("tokens_per_s"), (int, float))]
    mfus = [float(e["mfu"]) for e in steps if isinstance(e.get("mfu"), (int, float))]
    return _Steps(
        computed=len(steps),
        completed=len(distinct),
        median_s=statistics.median(durations) if durations else 0.0,
        startup_s=startup_s,
        time_s=sum(float(e.get("duration_s") or 0.0) for e in steps),
        tokens_per_s=statistics.median(rates) if rates else None,
        mfu=statistics.median(mfus) if mfus else None,
    )


@dataclass(frozen=True, kw_only=True)
class _Checkpoints:
    """The run's checkpoints: the reference rank's time in them, and the saves committed or failed."""

    stall_s: float
    drain_s: float
    write_s: float
    committed: int
    failed: int


def _checkpoint_figures(mine: Sequence[Event], trainer: Sequence[Event]) -> _Checkpoints:
    """Times from the reference rank's events (`mine`); commits and failures from every rank's."""

    def ckpt_sum(phase: str) -> float:
        return sum(
            float(e.get("duration_s") or 0.0) for e in mine if e["kind"] == "ckpt" and e.get("phase") == phase
        )

    # One final wait can be logged by two layers (trainer and checkpointer): keep one per process and step.
    drains: dict[tuple[Any, Any], float] = {}
    for e in mine:
        if e["kind"] == "ckpt" and e.get("phase") == "drain":
            key = (e.get("pid"), e.get("step"))
            drains[key] = max(drains.get(key, 0.0), float(e.get("duration_s") or 0.0))
    ckpt = [e for e in trainer if e["kind"] == "ckpt"]
    committed = {(e.get("attempt"), e.get("step")) for e in ckpt if e.get("phase") == "commit"}
    failed = {(e.get("attempt"), e.get("step")) for e in ckpt if e.get("phase") == "failed"}
    return _Checkpoints(
        stall_s=ckpt_sum("stall"),
        drain_s=sum(drains.values()),
        write_s=ckpt_sum("write"),
        committed=len(committed),
        failed=len(failed),
    )


def _all_faults(evs: Sequence[Event]) -> list[FaultMetrics]:
    """Every fault's metrics; what follows the next fault is the next fault's."""
    fault_events = _unique_faults(evs)
    nexts = [_ts(f) for f in fault_events[1:]] + [float("inf")] * bool(fault_events)
    return [_fault_metrics(evs, f, until) for f, until in zip(fault_events, nexts, strict=True)]


def _restart_counts(evs: Sequence[Event], trainer: Sequence[Event]) -> tuple[int, int, int]:
    """(worker-group attempts, the launcher's restarts, in-process restarts counted once per restart)."""
    attempts = {int(e.get("attempt") or 0) for e in evs}
    restarts = sum(1 for e in evs if e.get("role") == "launcher" and e["kind"] == "restart")
    inprocess = defaultdict(int)
    for e in trainer:
        if e["kind"] == "inprocess_restart":
            inprocess[int(e["rank"])] += 1
    return max(attempts, default=0) + 1, restarts, max(inprocess.values(), default=0)


def _outcome(finished: bool, evs: list[Event]) -> str:
    """The run's end as its launchers' `exit` events say it (a run whose report and exit status agree)."""
    if finished:
        return "finished"
    failed = [e for e in evs if e.get("role") == "launcher" and e["kind"] == "exit" and e.get("code")]
    if not failed:
        return "unfinished"
    first = failed[0]
    return f"failed: exit {first.get('code')}: {first.get('reason') or 'no reason given'}"


def compute_metrics(events: Iterable[Event]) -> RunMetrics:
    """All of the design's metrics from one run's events (any order; sorted here by time)."""
    given = list(events)
    evs = sorted((e for e in given if _well_formed(e)), key=_ts)
    trainer = [e for e in evs if _is_trainer(e)]
    if not trainer:
        raise MetricsError("no trainer events in this run: point at a folder a training run wrote to")
    ranks = sorted({int(e["rank"]) for e in trainer})
    ref = ranks[0]
    mine = [e for e in trainer if int(e["rank"]) == ref]
    starts = [e for e in trainer if e["kind"] == "start"]
    ends = [e for e in trainer if e["kind"] == "end"]
    t_first = _ts(starts[0]) if starts else _ts(trainer[0])
    t_last = _ts(ends[-1]) if ends else _ts(trainer[-1])
    wall_s = max(0.0, t_last - t_first)
    steps = [e for e in mine if e["kind"] == "step"]
    counted = _step_figures(evs, ref, steps, ends, t_first)
    ckpt = _checkpoint_figures(mine, trainer)
    faults = _all_faults(evs)
    attempts, restarts, inprocess_restarts = _restart_counts(evs, trainer)
    launchers = [e for e in evs if e["kind"] == "launcher_start"]
    metrics = RunMetrics(
        world_size=max((int(e.get("world_size") or 0) for e in starts), default=0) or len(ranks),
        spare_nodes=max((int(e.get("spares") or 0) for e in launchers), default=0),
        training_nodes=max((int(e.get("nodes") or 0) for e in launchers), default=0),
        wall_s=wall_s,
        steps_completed=counted.completed,
        steps_computed=counted.computed,
        lost_steps=max(0, counted.computed - counted.completed),
        median_step_s=counted.median_s,
        stall_s=ckpt.stall_s,
        drain_s=ckpt.drain_s,
        efficiency=1.0 - _ratio(ckpt.stall_s, wall_s),
        checkpoints_committed=ckpt.committed,
        checkpoints_failed=ckpt.failed,
        faults=faults,
        recovery_s_total=sum(f.recovery_s or 0.0 for f in faults),
        downtime_s_total=sum(f.downtime_s or 0.0 for f in faults),
        step_time_s=counted.time_s,
        startup_s=counted.startup_s,
        finished=bool(ends),
        outcome=_outcome(bool(ends), evs),
        attempts=attempts,
        restarts=restarts,
        inprocess_restarts=inprocess_restarts,
        faults_recovered=sum(1 for f in faults if f.recovery_s is not None),
        restores={
            source: n
            for source in RESTORE_SOURCES
            if (n := sum(1 for f in faults if f.resume_source == source))
        },
        faults_unfired=list(dict.fromkeys(str(e.get("fault")) for e in trainer if e["kind"] == UNFIRED)),
        stragglers=_stragglers(evs, steps),
        checkpoint_write_s=ckpt.write_s,
        events_skipped=len(given) - len(evs),
        tokens_per_s=counted.tokens_per_s,
        mfu=counted.mfu,
        world_spans=_world_spans(mine, t_first, t_last),
        reshards=sum(1 for e in mine if e["kind"] == "resharded"),
    )
    over = goodput_over(metrics, wall_s)
    return dataclasses.replace(
        metrics, goodput=over.strict, training_goodput=over.training, infra_goodput=over.infra
    )


def load_run_metrics(run_dir: str | os.PathLike[str]) -> RunMetrics:
    """Metrics of the run folder `run_dir`; MetricsError with the fix when it is not a run folder."""
    path = Path(run_dir)
    if not path.is_dir():
        what = "is a file, not a run folder" if path.exists() else "does not exist"
        raise MetricsError(f"run folder {str(path)!r} {what}: pass <run.root>/<run.id>, e.g. runs/x")
    folder = events_dir(path)
    if not folder.is_dir() or not any(folder.glob("*.jsonl")):
        raise MetricsError(
            f"{str(path)!r} has no events/*.jsonl: pass a run folder that fsdpkit.trainer.train wrote"
        )
    return compute_metrics(load_events(path))


def load_events(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """A run's events sorted by time, checked line by line: MetricsError names the file and line of the
    first line that is not UTF-8, not a JSON object, or has no numeric `ts` or no `kind`. Only a file's
    torn last line (its writer was killed mid-write) is skipped, as `fsdpkit.runtime.events.read_events`
    does."""
    events: list[dict[str, Any]] = []
    for path in sorted(events_dir(run_dir).glob("*.jsonl")):
        try:
            lines = path.read_bytes().split(b"\n")
        except OSError as exc:
            raise MetricsError(f"{path}: cannot be read ({exc.strerror}); check its permissions") from None
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{number}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise MetricsError(
                    f"{where}: byte {exc.start} is not UTF-8; the file is damaged: remove that line"
                ) from None
            try:
                event = json.loads(text)
            except json.JSONDecodeError:
                if number == len(lines):  # no newline after it: torn by a kill
                    continue
                raise MetricsError(f"{where}: not a JSON line; remove or repair that line") from None
            if not isinstance(event, dict):
                raise MetricsError(f"{where}: not a JSON object; remove or repair that line")
            ts = event.get("ts")
            if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
                raise MetricsError(
                    f"{where}: event without a numeric 'ts' (got {ts!r}); every event needs its wall-clock "
                    "time: remove or repair that line"
                )
            if not isinstance(event.get("kind"), str):
                raise MetricsError(f"{where}: event without a 'kind'; remove or repair that line")
            events.append(event)
    events.sort(key=lambda e: e["ts"])
    return events
