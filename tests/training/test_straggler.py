"""Stragglers (training/resilience/straggler.py): the rule on simulated ranks (noise never trips it, a slow
rank is found within the issue's step budgets, every rank reaches the same verdict), the `slow` fault's
grammar and the section's one-line refusals. The real run (the kit's trainer on 2 pods through the local
Job, a rank made 3x slower, found, named, evicted for a spare) is in tests/k8s/test_k8s_node_faults.py;
bench.stragglers measures the detection delays and the false alarms under load."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest

from fsdpkit.resilience.faults import FaultConfigError, parse_kinds, parse_spec
from fsdpkit.resilience.straggler import StragglerConfig, StragglerConfigError, StragglerDetector, scores

REPO = Path(__file__).resolve().parents[2]


def simulate(*, world: int, steps: int, slow_rank: int | None, factor: float, onset: int, noise: float,
             seed: int = 7) -> tuple[int | None, list[StragglerDetector]]:  # fmt: skip
    """Each rank's compute per step (0.1 s, Gaussian noise of `noise` relative, `factor` on `slow_rank` from
    `onset`), shared as the trainer shares it: the step at which rank 0 confirmed a straggler, or None."""
    rng = random.Random(seed)
    dets = [
        StragglerDetector(cfg=StragglerConfig(), rank=r, world_size=world, ranks_per_node=1)
        for r in range(world)
    ]
    found = None
    for step in range(1, steps + 1):
        for r, d in enumerate(dets):
            slow = factor if r == slow_rank and step >= onset else 1.0
            d.observe(0.1 * slow * max(0.1, rng.gauss(1.0, noise)))
        if dets[0].due(step):
            figures = [sum(v) for v in zip(*(d.own_slot() for d in dets), strict=True)]
            verdicts = [d.judge(figures, step) for d in dets]
            assert all(v == verdicts[0] for v in verdicts)  # the same rule on the same figures
            if verdicts[0] and found is None:
                found = step
    return found, dets


@pytest.mark.parametrize("world", [2, 4, 16])
def test_noise_never_makes_a_straggler(world: int) -> None:
    """10 % noise per step (more than a loaded 2-core machine shows in a rank's CPU time), 600 steps."""
    found, dets = simulate(world=world, steps=600, slow_rank=None, factor=1.0, onset=0, noise=0.10)
    assert found is None and dets[0].found == {}
    assert dets[0].threshold is not None and dets[0].threshold >= 1.2


@pytest.mark.parametrize(("factor", "budget"), [(2.0, 10), (1.5, 30)])
@pytest.mark.parametrize("onset", [41, 42, 43, 44])
def test_a_slow_rank_is_found_within_the_budget(factor: float, budget: int, onset: int) -> None:
    found, dets = simulate(world=4, steps=120, slow_rank=2, factor=factor, onset=onset, noise=0.03)
    assert found is not None and found - onset <= budget, found
    (s,) = dets[0].found.values()
    assert s.rank == 2 and s.node == 2 and s.score == pytest.approx(factor, rel=0.1)


def test_a_node_is_named_by_its_ranks() -> None:
    det = StragglerDetector(cfg=StragglerConfig(policy="replace"), rank=0, world_size=16, ranks_per_node=8)
    for step in (4, 8, 12, 16, 20):  # the warm-up (4 reports), then one report without a straggler
        assert det.judge([1.0] * 16, step) == []
    det.judge([1.0] * 11 + [2.0] + [1.0] * 4, 24)
    (s,) = det.judge([1.0] * 11 + [2.0] + [1.0] * 4, 28)
    assert (s.rank, s.node) == (11, 1) and det.found == {11: s}


def test_the_slow_fault_grammar() -> None:
    (f,) = parse_spec("slow:step=20:rank=1:factor=2")
    assert (f.kind, f.step, f.rank, f.factor, str(f)) == ("slow", 20, 1, 2.0, "slow:step=20:rank=1:factor=2")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("slow:step=20:rank=1", "slow needs factor=F"),
        ("slow:step=20:rank=1:factor=nan", "factor must be a number > 1 and <= 100"),
        ("slow:step=20:rank=1:factor=1", "factor must be a number > 1"),
        ("slow:step=20:rank=1:factor=inf", "factor must be a number > 1"),
        ("slow:step=20:rank=1:factor=x", "got 'x'"),
        ("kill:step=20:rank=1:factor=2", "kill takes no factor="),
        ("slow:step=20:node=1:factor=2", "slow takes rank=, not node="),
        ("slow:step=20:rank=1:factor=2:factor=3", "factor given twice"),
    ],
)
def test_bad_slow_faults_are_one_line(spec: str, message: str) -> None:
    with pytest.raises(FaultConfigError) as err:
        parse_spec(spec)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_seeded_schedule_draws_no_stragglers() -> None:
    with pytest.raises(FaultConfigError, match="unknown kind 'slow'"):
        parse_kinds("exception:0.5,slow:0.5")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("policy", "evict", "straggler.policy='evict': use off, report or replace"),
        ("every", 0, "straggler.every=0: give a whole number from 1 to 10000"),
        ("confirm", True, "straggler.confirm=True"),
        ("min_margin", float("nan"), "straggler.min_margin=nan: give a number > 0"),
        ("noise_k", -1.0, "straggler.noise_k=-1.0"),
    ],
)
def test_bad_straggler_settings_are_one_line(field: str, value: object, message: str) -> None:
    with pytest.raises(StragglerConfigError) as err:
        StragglerConfig(**{field: value})  # type: ignore[arg-type]
    assert str(err.value).startswith(message)


def test_scores_are_each_figure_over_the_median_of_the_others() -> None:
    """The sorted-once form gives what statistics.median of each rank's others gives, ties and a zero
    median included, for odd and even counts of others."""
    rng = random.Random(3)

    def by_definition(figures: list[float]) -> list[float]:
        out = []
        for r, value in enumerate(figures):
            others = [v for q, v in enumerate(figures) if q != r]
            ref = statistics.median(others) if others else value
            out.append(value / ref if ref > 0 else 1.0)
        return out

    for n in [*range(12), 31, 64, 257]:
        for _ in range(20):
            figures = [rng.choice([0.0, 0.5, 1.0, 1.0, 2.0, rng.uniform(0, 3)]) for _ in range(n)]
            assert scores(figures) == by_definition(figures), figures
    assert scores([0.1] * 8192) == [1.0] * 8192  # a 1,024-node job's report (by definition: seconds)
