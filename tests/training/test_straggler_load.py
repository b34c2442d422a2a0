"""Stragglers under load (training/resilience/straggler.py): load on the host inflates every rank's CPU time,
unevenly and for a while, and must not make a straggler; a slow rank under the same load is still found.
The load is simulated on the figures the ranks share, as tests/training/test_straggler.py simulates noise;
bench.stragglers measures the false alarms of real runs beside a CPU load."""

from __future__ import annotations

import random

import pytest

from fsdpkit.resilience.straggler import PERSIST, StragglerConfig, StragglerDetector

EVERY, WARMUP = 2, 3
"""The demo's settings: the shortest reports a run uses, so the noisiest figures."""


def simulate_load(*, world: int, steps: int, seed: int, slow_rank: int | None = None, factor: float = 1.0,
                  onset: int = 0) -> tuple[int, int] | None:  # fmt: skip
    """Each rank computes 0.1 s a step (3 % noise); now and then the node is loaded for 2-12 steps, by
    L = 1.1-1.6, and each rank takes its own share of it (0.5-1.5 x L - 1), as processes beside the job
    land on one core more than another. (step, rank) of the first straggler rank 0 confirmed, or None."""
    rng = random.Random(seed)
    cfg = StragglerConfig(every=EVERY, warmup=WARMUP)
    dets = [StragglerDetector(cfg=cfg, rank=r, world_size=world, ranks_per_node=1) for r in range(world)]
    load, left, shares = 1.0, rng.randint(2, 20), [1.0] * world
    for step in range(1, steps + 1):
        left -= 1
        if left <= 0 and load == 1.0:
            load, left = rng.uniform(1.1, 1.6), rng.randint(2, 12)
            shares = [rng.uniform(0.5, 1.5) for _ in range(world)]
        elif left <= 0:
            load, left = 1.0, rng.randint(2, 20)
        for r, det in enumerate(dets):
            slow = factor if r == slow_rank and step >= onset else 1.0
            det.observe(0.1 * slow * (1.0 + (load - 1.0) * shares[r]) * max(0.1, rng.gauss(1.0, 0.03)))
        if dets[0].due(step):
            figures = [sum(v) for v in zip(*(d.own_slot() for d in dets), strict=True)]
            verdicts = [d.judge(figures, step) for d in dets]
            assert all(v == verdicts[0] for v in verdicts)  # the same rule on the same figures
            if verdicts[0]:
                return step, verdicts[0][0].rank
    return None


@pytest.mark.parametrize("world", [2, 4, 16])
@pytest.mark.parametrize("seed", range(5))
def test_load_that_comes_and_goes_on_every_rank_makes_no_straggler(world: int, seed: int) -> None:
    assert simulate_load(world=world, steps=600, seed=seed) is None


@pytest.mark.parametrize("world", [2, 4, 16])
@pytest.mark.parametrize("seed", range(5))
def test_a_3x_rank_under_the_same_load_is_found_in_confirm_reports(world: int, seed: int) -> None:
    found = simulate_load(world=world, steps=200, seed=seed, slow_rank=1, factor=3.0, onset=81)
    assert found is not None and found[1] == 1, found
    assert found[0] - 81 < (StragglerConfig().confirm + 1) * EVERY  # the first whole report, and one more


def _learned(det: StragglerDetector, world: int) -> int:
    """Warm the detector up on a calm job (threshold 1 + min_margin); the next report's step."""
    for step in range(EVERY, (WARMUP + 1) * EVERY + 1, EVERY):
        assert det.judge([1.0] * world, step) == []
    assert det.threshold == pytest.approx(1.2)
    return (WARMUP + 2) * EVERY


def test_a_rank_slower_while_the_whole_node_is_loaded_is_not_a_straggler() -> None:
    """The failure this rule answers: a calm warm-up, then rank 1 reads 1.25x its peer for reports on end
    while rank 0 itself is 15 % slower than its best: the node's load, not a slow rank."""
    det = StragglerDetector(cfg=StragglerConfig(every=EVERY, warmup=WARMUP), rank=0, world_size=2)
    first = _learned(det, 2)
    for step in range(first, first + 10 * EVERY, EVERY):
        assert det.judge([1.15, 1.15 * 1.25], step) == []
    assert det.bar == pytest.approx(1.3)  # 1 + 2 x the shared 15 %
    assert det.found == {}


def test_a_burst_that_only_just_clears_the_bar_must_last_longer() -> None:
    """A rank 1.25x its peer with the peer at its best: a burst of `confirm` reports passes; the same excess
    held for PERSIST x `confirm` reports is a straggler; a clear excess needs only `confirm`."""
    cfg = StragglerConfig(every=EVERY, warmup=WARMUP)
    det = StragglerDetector(cfg=cfg, rank=0, world_size=2)
    step = _learned(det, 2)
    for _ in range(PERSIST * cfg.confirm - 1):
        assert det.judge([1.0, 1.25], step) == []
        step += EVERY
    assert det.judge([1.0, 1.0], step) == []  # it went: the run starts again
    start = step + EVERY
    verdicts = [det.judge([1.0, 1.25], start + i * EVERY) for i in range(PERSIST * cfg.confirm)]
    assert [bool(v) for v in verdicts] == [False] * (PERSIST * cfg.confirm - 1) + [True]
    (s,) = verdicts[-1]
    assert (s.rank, s.since_step, s.score) == (1, start, pytest.approx(1.25))

    clear = StragglerDetector(cfg=cfg, rank=0, world_size=2)
    step = _learned(clear, 2)
    assert clear.judge([1.0, 1.5], step) == []
    (s,) = clear.judge([1.0, 1.5], step + EVERY)
    assert (s.rank, s.step) == (1, step + EVERY)
