"""Stragglers: the rank that is only slower (a throttled GPU, a degraded link, a noisy host process).

FSDP's collectives are synchronous, so one slow rank makes every rank wait and nothing fails. What tells the
slow rank apart is its own compute, not its step time (every rank's step takes as long as the slowest):

- Each rank times its own work every step (training/resilience/compute_timer.py). On CPU (gloo): the
  thread's CPU time from the top of the step to its report (the step's one all-reduce); a rank waiting for
  its peers in a collective sleeps, so the wait is not counted. On CUDA: CUDA events around what the rank
  does alone, its optimizer step and a fixed compute-bound probe (FSDP's collectives pace every rank's whole
  step to the slowest, so the whole step cannot tell it); read after the report, one step later.
- Every `every` steps each rank puts the median of its last `every` compute times in its own slot of a
  world-size vector that the step's all-reduce already carries (SUM): every rank then holds every rank's
  figure, with no collective of its own and O(world) floats once per `every` steps.
- Every rank applies the same rule to the same figures, so they agree on the verdict without talking:
  score(r) = figure(r) / median of the other ranks' figures; a rank is a straggler when its score is at least
  the threshold in `confirm` consecutive reports. The threshold is learned from the job's own spread, as the
  launcher learns its heartbeat timeout: over the first `warmup` reports, the scores' robust spread s
  (1.4826 x their median absolute deviation from 1), then threshold = 1 + max(min_margin, noise_k x s).
  Until then nobody is judged.
- Load on the host is not a slow rank. It inflates every rank's CPU time (preemptions, a cold cache), but
  unevenly and for a while: on 2 cores beside other jobs one rank reads 1.2-1.5x its peer for a few steps,
  then the other. Two guards, both computed from the shared figures, so every rank still agrees:
  - a slowdown every rank shares raises the bar: each rank's figure over its own best report so far, the
    lower median of those over the ranks (a straggler's own slowdown does not count while fewer than half
    the ranks are slow) is the node's load L, and a report's margin is at least SHARED_LOAD_K x (L - 1);
  - an excess that only just clears the bar (the run's median score within `min_margin` of it) must last
    PERSIST x `confirm` reports: a burst of load on one rank comes and goes, a slow rank stays. A clear
    excess (a rank 2-3x slower) is still confirmed in `confirm` reports.

A straggler is reported once per rank (`straggler` event by rank 0, one line): the rank, its node (pod
index: rank // ranks per node), how much slower, since which report. Policy `replace` also marks the slow
node to go at the next step boundary exactly as a drain does (Job.drain_and_exit: save, commit, exit), so a
hot spare takes its place with no lost step.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from fsdpkit.contracts import env

StragglerPolicy = Literal["off", "report", "replace"]
STRAGGLER_EVENT = "straggler"
SPARES_ENV = env.SPARES
SHARED_LOAD_K = 2.0
"""A report's margin is at least this many times the slowdown every rank shares: load that slows the whole
node by L inflates one rank's CPU time more than another's (by up to about 2 x (L - 1) on 2 cores beside
other training runs)."""
PERSIST = 2
"""A run of reports that only just clears the threshold needs this many times `confirm` reports."""


class StragglerConfigError(ValueError):
    """A bad `straggler` setting; one line that names it."""


@dataclass(frozen=True, kw_only=True)
class StragglerConfig:
    """The trainer config's `straggler` section."""

    policy: StragglerPolicy = "report"
    """off: no timing shared; report: a straggler is an event and one line naming its rank and node; replace:
    also evict its node at the next step boundary as a drain does (a hot spare takes over, 0 lost steps)."""
    every: int = 4
    """Steps between the ranks' compute reports (each the median of its last `every` steps: with 4, a rank
    slow for 2 of them already reads half-way slow)."""
    confirm: int = 2
    """Consecutive reports at or above the threshold that make a rank a straggler."""
    warmup: int = 4
    """Reports that measure the job's own spread before anyone is judged."""
    min_margin: float = 0.2
    """The smallest margin: a straggler is at least this much slower than its peers' median (0.2: 20 %)."""
    noise_k: float = 6.0
    """The threshold's margin in units of the job's own robust spread of scores, when that is wider."""

    def __post_init__(self) -> None:
        if self.policy not in ("off", "report", "replace"):
            raise StragglerConfigError(f"straggler.policy={self.policy!r}: use off, report or replace")
        for name, lo in (("every", 1), ("confirm", 1), ("warmup", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= 10_000:
                raise StragglerConfigError(
                    f"straggler.{name}={value!r}: give a whole number from {lo} to 10000"
                )
        for name, hi in (("min_margin", 10.0), ("noise_k", 100.0)):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or not 0 < value <= hi:
                raise StragglerConfigError(f"straggler.{name}={value!r}: give a number > 0 and <= {hi:g}")


@dataclass(frozen=True, kw_only=True)
class Straggler:
    rank: int
    node: int
    score: float
    """How many times slower than the median of its peers (its last report)."""
    since_step: int
    """The step of the first report of its confirming run."""
    step: int
    """The step at which it was confirmed."""
    compute_s: float
    peers_s: float


def scores(figures: Sequence[float]) -> list[float]:
    """Each rank's figure over the median of the others' (a lone rank scores 1).

    The others' median is read off the figures sorted once, with the rank's own place skipped: the same
    value statistics.median gives, in O(n log n) (the median of each rank's others, sorted anew, took
    ~12 s a report at 8,192 ranks on the 2-core test VM, on every rank, every `every` steps; now ~3 ms)."""
    n = len(figures)
    if n < 2:
        return [1.0] * n
    order = sorted(range(n), key=figures.__getitem__)
    ranked = [figures[i] for i in order]
    place = [0] * n
    for p, r in enumerate(order):
        place[r] = p
    half = (n - 1) // 2  # the others are n - 1 values

    def other(j: int, skip: int) -> float:  # the j-th smallest of the others
        return ranked[j if j < skip else j + 1]

    out = []
    for r, value in enumerate(figures):
        p = place[r]
        ref = other(half, p) if (n - 1) % 2 else (other(half - 1, p) + other(half, p)) / 2
        out.append(value / ref if ref > 0 else 1.0)
    return out


@dataclass(kw_only=True)
class StragglerDetector:
    """One rank's side: its compute times, and the shared rule (the same verdicts on every rank)."""

    cfg: StragglerConfig
    rank: int
    world_size: int
    ranks_per_node: int = 1
    _own: deque[float] = field(default_factory=deque)
    _warm: list[float] = field(default_factory=list)
    _best: list[float] = field(default_factory=list)
    _runs: dict[int, list[float]] = field(default_factory=dict)
    _since: dict[int, int] = field(default_factory=dict)
    threshold: float | None = None
    """1 + margin once learned; None during the warm-up."""
    bar: float | None = None
    """The last report's threshold: `threshold`, raised by a slowdown every rank shared."""
    found: dict[int, Straggler] = field(default_factory=dict)
    """Confirmed stragglers by rank (each reported once)."""

    @property
    def active(self) -> bool:
        return self.cfg.policy != "off" and self.world_size > 1

    def observe(self, compute_s: float) -> None:
        """This rank's compute time of one step."""
        self._own.append(compute_s)
        while len(self._own) > self.cfg.every:
            self._own.popleft()

    def due(self, step: int) -> bool:
        """Whether the report of `step` carries the compute vector (the same answer on every rank)."""
        return self.active and step % self.cfg.every == 0

    def own_slot(self) -> list[float]:
        """The vector this rank adds to the all-reduce: its median in its own slot, 0 elsewhere."""
        vector = [0.0] * self.world_size
        vector[self.rank] = statistics.median(self._own) if self._own else 0.0
        return vector

    def judge(self, figures: Sequence[float], step: int) -> list[Straggler]:
        """Every rank's figure at report `step` (the all-reduced vector); the stragglers newly confirmed."""
        if any(v <= 0 for v in figures):  # a rank with no step timed yet (a fresh group): nothing to compare
            return []
        s = scores(figures)
        load = self._shared_load(figures)
        if self.threshold is None:
            self._warm.extend(s)
            if len(self._warm) >= self.cfg.warmup * len(figures):
                spread = 1.4826 * statistics.median(abs(v - 1.0) for v in self._warm)
                self.threshold = 1.0 + max(self.cfg.min_margin, self.cfg.noise_k * spread)
            return []
        margin = max(self.threshold - 1.0, SHARED_LOAD_K * (load - 1.0))
        self.bar = 1.0 + margin
        new = []
        for r, score in enumerate(s):
            if score < self.bar:
                self._runs.pop(r, None)
                continue
            run = self._runs.setdefault(r, [])
            if not run:
                self._since[r] = step
            run.append(score)
            clear = statistics.median(run) >= self.bar + self.cfg.min_margin
            if len(run) >= self.cfg.confirm * (1 if clear else PERSIST) and r not in self.found:
                others = [v for q, v in enumerate(figures) if q != r]
                self.found[r] = Straggler(
                    rank=r, node=r // max(1, self.ranks_per_node), score=score, since_step=self._since[r],
                    step=step, compute_s=figures[r], peers_s=statistics.median(others),
                )  # fmt: skip
                new.append(self.found[r])
        return new

    def _shared_load(self, figures: Sequence[float]) -> float:
        """The slowdown every rank shares at this report (>= 1): each rank's figure over its own best so far
        (interference only adds CPU time, so the best is the closest to its unloaded speed), the lower
        median over the ranks, so that fewer than half the ranks being slow is not load."""
        if len(self._best) != len(figures):
            self._best = list(figures)
        self._best = [min(b, v) for b, v in zip(self._best, figures, strict=True)]
        slowdowns = sorted(v / b for v, b in zip(figures, self._best, strict=True))
        return slowdowns[(len(slowdowns) - 1) // 2]
