"""bench.own_model's figures from written logs: the final trajectory of a sample log (a replayed step
replaces the earlier computation), exactly-once, and the RESULT line. The runs themselves (the example under
faults through the local runner) are tests/k8s/test_k8s_own_model.py's."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench.own_model import exactly_once, final_ids, result_line, trajectory


def _log(run: Path, rank: int, records: list[tuple[int, list[int]]]) -> None:
    run.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": step, "ids": ids, "pid": 1}) for step, ids in records]
    (run / f"samples.rank{rank}").write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_a_replayed_step_counts_once_with_its_last_computation(tmp_path: Path) -> None:
    ref, run = tmp_path / "ref", tmp_path / "run"
    _log(ref, 0, [(1, [0, 1]), (2, [4, 5]), (3, [8, 9])])
    _log(ref, 1, [(1, [2, 3]), (2, [6, 7]), (3, [10, 11])])
    _log(run, 0, [(1, [0, 1]), (2, [4, 5]), (2, [4, 5]), (3, [8, 9])])  # step 2 again after a resume
    _log(run, 1, [(1, [2, 3]), (2, [6, 7]), (3, [10, 11])])
    assert trajectory(run)["samples.rank0"] == {1: [0, 1], 2: [4, 5], 3: [8, 9]}
    assert sorted(final_ids(run)) == list(range(12))
    assert exactly_once(run, ref, steps=3)


def test_a_missing_step_a_sample_twice_or_other_samples_are_not_exactly_once(tmp_path: Path) -> None:
    ref = tmp_path / "ref"
    _log(ref, 0, [(1, [0, 1]), (2, [2, 3])])
    gap, twice, shifted = tmp_path / "gap", tmp_path / "twice", tmp_path / "shifted"
    _log(gap, 0, [(1, [0, 1])])
    _log(twice, 0, [(1, [0, 1]), (2, [0, 1])])  # a resume that rewound the data position too far
    _log(shifted, 0, [(1, [0, 1]), (2, [4, 5])])  # one that skipped ahead
    assert not exactly_once(gap, ref, steps=2)
    assert not exactly_once(twice, ref, steps=2)
    assert not exactly_once(shifted, ref, steps=2)


def test_the_result_line_names_every_figure_the_issue_asks_for() -> None:
    line = result_line({"faults": 3, "recovered": 3, "unfired": 0, "equal_on_disk": 1, "exactly_once": 1,
                        "loss_drop": 1.07861, "api_overhead": 1.0123})  # fmt: skip
    fields = dict(re.findall(r"(\w+)=(\S+)", line))
    assert (
        line.startswith("RESULT ") and fields["loss_drop"] == "1.0786" and fields["api_overhead"] == "1.012"
    )
    assert set(fields) == {"faults", "recovered", "unfired", "equal_on_disk", "exactly_once", "loss_drop",
                           "api_overhead"}  # fmt: skip
