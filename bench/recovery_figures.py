"""From the recovery benchmark's outcomes to its RESULT figures: medians over the repetitions, ratios
paired per repetition, counts at their worst."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from bench.recovery_cases import Case, NodeCase, NodeOutcome, Outcome


@dataclass(frozen=True, kw_only=True)
class Figure:
    """A RESULT figure of one run: the median over its repetitions and their spread."""

    value: float | None
    low: float | None
    high: float | None
    n: int
    """Repetitions that gave a value (a ratio's numerator and denominator both measured in the same rep)."""

    def text(self, digits: int = 2) -> str:
        return "nan" if self.value is None else f"{self.value:.{digits}f}"

    def spread(self, digits: int = 2) -> str:
        if self.low is None or self.high is None:
            return "-"
        return f"{self.low:.{digits}f}-{self.high:.{digits}f}"


RATIO_KEYS = (
    "kill_recovery_ratio", "inprocess_ratio", "hang_detect_steps", "node_recovery_ratio", "node_freeze_ratio",
)  # fmt: skip
"""RESULT figures compared by relative spread across runs (--check-stability)."""
COUNT_KEYS = ("false_restarts", "pod0_survived", "drain_lost_steps")
"""RESULT figures that are whole numbers: runs agree only if they are equal."""
RESULT_KEYS = ("kill_recovery_ratio", "inprocess_ratio", "hang_detect_steps", "false_restarts",
               "node_recovery_ratio", "pod0_survived", "drain_lost_steps", "node_freeze_ratio")  # fmt: skip
"""The RESULT line's figures, in its order (bench/goodput.py and the docs read them by name)."""


def recovery(o: Outcome) -> float | None:
    if o.metrics is None or not o.metrics.faults:
        return None
    return o.metrics.faults[0].recovery_s


def detection(o: Outcome) -> float | None:
    if o.metrics is None or not o.metrics.faults:
        return None
    return o.metrics.faults[0].detect_s


def node_recovery(o: NodeOutcome) -> float | None:
    f = node_fault(o)
    return None if f is None else f.recovery_s


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def fmt(value: float | None, unit: str = " s") -> str:
    return "-" if value is None else f"{value:.2f}{unit}"


def figure(values: Sequence[float | None]) -> Figure:
    present = [v for v in values if v is not None]
    if not present:
        return Figure(value=None, low=None, high=None, n=0)
    return Figure(value=statistics.median(present), low=min(present), high=max(present), n=len(present))


def paired_ratio(nums: Sequence[float | None], dens: Sequence[float | None]) -> Figure:
    """Median and spread of the per-repetition ratios num[i] / den[i] (interleaved: one drift hits both)."""
    ratios = [a / b if a is not None and b else None for a, b in zip(nums, dens, strict=False)]
    return figure(ratios)


@dataclass(kw_only=True)
class Results:
    """Every outcome of one benchmark run, by case, in the order the repetitions ran."""

    single: dict[Case, list[Outcome]] = field(default_factory=dict)
    nodes: dict[NodeCase, list[NodeOutcome]] = field(default_factory=dict)

    def of(self, mechanism: str, fault: str) -> list[Outcome]:
        return self.single.get(Case(mechanism=mechanism, fault=fault), [])

    def node(self, mechanism: str, fault: str, node: int) -> list[NodeOutcome]:
        return self.nodes.get(NodeCase(mechanism=mechanism, fault=fault, node=node), [])


def figures(results: Results) -> dict[str, Figure]:
    """The RESULT figures: medians over the repetitions, ratios paired per repetition."""

    def rec(mechanism: str, fault: str) -> list[float | None]:
        return [recovery(o) for o in results.of(mechanism, fault)]

    hangs = results.of("kit", "hang")
    steps = [o.metrics.median_step_s if o.metrics else None for o in hangs]
    free = [o for c, outs in results.single.items() if c.fault == "none" for o in outs]
    pod0 = results.node("kit+spare", "node", 0)
    drains = [node_fault(o) for o in results.node("kit+spare", "drain", 1)]
    lost = [f.lost_steps for f in drains if f is not None and f.lost_steps is not None]
    survived = [int(o.survived) for o in pod0]
    restarts = [o.restarts for o in free]
    return {
        "kill_recovery_ratio": paired_ratio(rec("kit", "kill"), rec("ft_launcher", "kill")),
        "inprocess_ratio": paired_ratio(rec("kit-inproc", "exception"), rec("nvrx-wrapper", "exception")),
        "hang_detect_steps": paired_ratio([o.hang_detect_s for o in hangs], steps),
        "false_restarts": _worst(restarts, max),
        "node_recovery_ratio": paired_ratio(
            [node_recovery(o) for o in results.node("kit+spare", "node", 1)], rec("kit", "kill")
        ),
        "node_freeze_ratio": paired_ratio(
            [node_recovery(o) for o in results.node("kit+spare", "freeze", 1)], rec("kit", "kill")
        ),
        "pod0_survived": _worst(survived, min),
        "drain_lost_steps": _worst(lost, max),
    }


def _worst(values: list[int], pick: Callable[[list[int]], int]) -> Figure:
    """A count over the repetitions: the worst one is the figure (a job lost once is not survived)."""
    if not values:
        return Figure(value=None, low=None, high=None, n=0)
    return Figure(value=pick(values), low=min(values), high=max(values), n=len(values))


def result_line(figs: Mapping[str, Figure]) -> str:
    """`RESULT k=v ...` in RESULT_KEYS order: ratios to 2 decimals, counts whole."""
    return "RESULT " + " ".join(f"{k}={figs[k].text(2 if k in RATIO_KEYS else 0)}" for k in RESULT_KEYS)


def node_fault(o: NodeOutcome | None):  # type: ignore[no-untyped-def]
    return o.metrics.faults[0] if o is not None and o.metrics is not None and o.metrics.faults else None
