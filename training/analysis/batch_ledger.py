"""Which global samples each optimizer step consumed, read from a run's events, and two runs compared.

The kit's trainer puts the first global sample of each step and how many it consumed into rank 0's step
event (`sample_first`, `samples`). A run that changed its world size (a restart on other nodes, an elastic
shrink or grow) must still consume exactly what a fixed-size run consumes: the same samples in the same
optimizer steps, every sample once. A step computed again after a rollback counts once: its last
computation is the one whose result the run kept. Losses are compared within a relative tolerance, since
another world size sums the same gradients in another order (fp32 rounding: bitwise equality does not
hold, the data order does).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from fsdpkit.runtime.events import read_events


@dataclass(frozen=True)
class StepBatch:
    step: int
    loss: float | None
    first: int
    """Index of the step's first global sample."""
    samples: int
    """Samples the step consumed over all ranks: the global batch."""
    world_size: int
    """Ranks that computed the step (the last start before it)."""
    ts: float = 0.0
    """When the kept computation of the step ended (its event's time)."""


def step_batches(run_dir: str | os.PathLike[str]) -> dict[int, StepBatch]:
    """Step -> the batch rank 0's last computation of it consumed; steps without the fields are left out."""
    out: dict[int, StepBatch] = {}
    world = 0
    for e in read_events(run_dir):
        if e.get("rank") != 0 or e.get("role") not in (None, "trainer"):
            continue
        if e["kind"] == "start":
            world = int(e.get("world_size") or 0)
        elif e["kind"] == "step" and e.get("sample_first") is not None and e.get("samples") is not None:
            out[e["step"]] = StepBatch(
                e["step"], e.get("loss"), e["sample_first"], e["samples"], world, float(e["ts"])
            )
    return out


@dataclass
class LedgerComparison:
    steps: int
    exactly_once: bool
    """The kept steps' samples tile [0, total) in step order: none skipped, none repeated."""
    same_batches: bool
    """Every step consumed exactly the reference's samples."""
    global_batch_kept: bool
    """Every step consumed as many samples as the reference's step (and the reference's are all equal)."""
    max_loss_rel_diff: float
    worlds: list[int] = field(default_factory=list)
    """The world sizes the run went through, in order (one entry per change)."""
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return "; ".join(self.problems[:5]) or "the same global batches, every sample once"


def compare_ledgers(
    run: dict[int, StepBatch], reference: dict[int, StepBatch], *, prefix: bool = False
) -> LedgerComparison:
    """`run` against a fixed-size `reference` of the same job (the steps each consumed); `prefix`: the run
    was stopped early, and only the reference's first steps are compared."""
    problems: list[str] = []
    if prefix:
        reference = {s: b for s, b in reference.items() if s <= max(run, default=0)}
    once = sorted(run) == list(range(1, len(run) + 1)) and sorted(run) == sorted(reference)
    if not once:
        problems.append(f"steps {_span(run)} against the reference's {_span(reference)}")
    cursor = 0
    for step in sorted(run):
        batch = run[step]
        if batch.first != cursor:
            once = False
            problems.append(f"step {step} starts at sample {batch.first}, expected {cursor}")
        cursor = batch.first + batch.samples
    same, kept, worst = True, True, 0.0
    sizes = {b.samples for b in reference.values()}
    if len(sizes) > 1:
        kept = False
        problems.append(f"the reference's global batch varies: {sorted(sizes)}")
    for step, ref in sorted(reference.items()):
        mine = run.get(step)
        if mine is None:
            same = False
            continue
        if (mine.first, mine.samples) != (ref.first, ref.samples):
            same = False
            problems.append(
                f"step {step}: samples [{mine.first}, +{mine.samples}) vs [{ref.first}, +{ref.samples})"
            )
        if mine.samples != ref.samples:
            kept = False
        if mine.loss is not None and ref.loss is not None and ref.loss != 0:
            worst = max(worst, abs(mine.loss - ref.loss) / abs(ref.loss))
        elif mine.loss != ref.loss:
            worst = math.inf
    worlds: list[int] = []
    for step in sorted(run):
        if not worlds or worlds[-1] != run[step].world_size:
            worlds.append(run[step].world_size)
    return LedgerComparison(
        steps=len(run), exactly_once=once, same_batches=same,
        global_batch_kept=kept, max_loss_rel_diff=worst, worlds=worlds, problems=problems,
    )  # fmt: skip


def useful_steps(run: dict[int, StepBatch], by_ts: float) -> int:
    """Steps of the run's final result whose kept computation had ended by `by_ts` (replays count once, at
    their last computation: work lost to a rollback is not useful)."""
    return sum(1 for b in run.values() if b.ts <= by_ts)


def _span(steps: dict[int, StepBatch]) -> str:
    return f"{min(steps)}..{max(steps)} ({len(steps)})" if steps else "none"
