"""bench.elastic's arithmetic on hand-made ledgers: shrink_s, the useful steps in a window, the goals and the
RESULT line. The runs themselves are the benchmark's (real pods on the local runner); the same shrink and grow
is proven end to end in tests/k8s/test_k8s_node_faults.py."""

from __future__ import annotations

from bench import elastic
from fsdpkit.analysis.batch_ledger import StepBatch, compare_ledgers, useful_steps


def _ledger(worlds: list[int], *, start: float = 0.0, every: float = 1.0) -> dict[int, StepBatch]:
    return {
        i: StepBatch(i, 2.0, (i - 1) * 12, 12, world, start + i * every)
        for i, world in enumerate(worlds, start=1)
    }


def test_shrink_is_the_fault_to_the_first_step_on_fewer_ranks() -> None:
    ledger = _ledger([4, 4, 3, 3, 4])  # steps end at 1..5 s
    assert elastic.shrink_s(ledger, fault_at=2.5) == 0.5
    assert elastic.shrink_s(_ledger([4, 4, 4]), fault_at=1.0) is None


def test_useful_steps_count_each_kept_step_once_by_its_last_computation() -> None:
    ledger = _ledger([4, 4, 3, 3])
    assert useful_steps(ledger, 2.5) == 2
    assert useful_steps(ledger, 10.0) == 4


def test_the_goals_and_the_result_line() -> None:
    ref = _ledger([4] * 6)
    run = _ledger([4, 4, 3, 3, 4])
    ledger = compare_ledgers(run, ref, prefix=True)
    assert ledger.exactly_once and ledger.same_batches and ledger.global_batch_kept
    assert ledger.worlds == [4, 3, 4] and ledger.max_loss_rel_diff == 0.0
    fig = elastic.Figures(
        kill_recovery_s=1.5, replace_after_s=50.0, window_s=75.0, shrink_s=4.0, useful_elastic=60,
        useful_wait=30, ledger=ledger, worlds=ledger.worlds, order_diff=0.003,
    )  # fmt: skip
    assert fig.goodput_ratio == 2.0 and all(fig.goals().values())
    assert fig.loss_tolerance == 0.006  # twice what the order alone did, never below 1e-4
    assert elastic.Figures(**{**fig.__dict__, "order_diff": 1e-9}).loss_tolerance == elastic.LOSS_RTOL
    line = fig.result_line()
    assert line.startswith(
        "RESULT exactly_once=1 global_batch_kept=1 max_loss_rel_diff=0 loss_tolerance=0.006 shrink_s=4.00"
    )
    assert line.endswith("kill_recovery_s=1.50 goodput_ratio=2.00")
    slow = elastic.Figures(**{**fig.__dict__, "shrink_s": 4.6})
    assert not slow.goals()["shrink_s <= 3 x kill_recovery_s"]


def test_a_step_that_skips_samples_is_not_exactly_once() -> None:
    ref = _ledger([4] * 4)
    run = _ledger([4, 4, 3, 3])
    run[3] = StepBatch(3, 2.0, 30, 12, 3, 3.0)  # started 6 samples late: 24-29 never consumed
    ledger = compare_ledgers(run, ref)
    assert not ledger.exactly_once and not ledger.same_batches
    assert "step 3 starts at sample 30, expected 24" in ledger.summary()
