"""bench.own_model's figures from written logs: the final trajectory of a sample log (a replayed step
replaces the earlier computation), exactly-once, the step events' volume, the RESULT line and the section's
hand-written notes. The runs themselves (the example under faults through the local runner) are
tests/k8s/test_k8s_own_model.py's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import bench.own_model
from bench.own_model import (
    NOTES_MARK,
    QUICK,
    at_scale,
    exactly_once,
    final_ids,
    result_line,
    step_event_volume,
    trajectory,
    write_doc,
)
from fsdpkit.runtime.events import EventLog


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
                        "loss_drop": 1.07861, "api_overhead": 1.0123, "api_ms_per_step": 0.3051})  # fmt: skip
    fields = dict(re.findall(r"(\w+)=(\S+)", line))
    assert (
        line.startswith("RESULT ") and fields["loss_drop"] == "1.0786" and fields["api_overhead"] == "1.012"
    )
    assert fields["api_ms_per_step"] == "0.31"
    assert set(fields) == {"faults", "recovered", "unfired", "equal_on_disk", "exactly_once", "loss_drop",
                           "api_overhead", "api_ms_per_step"}  # fmt: skip


def test_the_step_event_volume_is_read_from_the_files_and_projected(tmp_path: Path) -> None:
    for rank in (0, 1):
        log = EventLog(tmp_path, role="trainer", rank=rank)
        log.emit("start", world_size=2)
        for step in (1, 2, 3):
            log.emit("step", step=step, loss=1.5, duration_s=0.025, t_start=0.0, compute_s=0.02)
        log.close()
    lines, size = step_event_volume(tmp_path, steps=3)
    assert lines == 1.0 and 100 < size < 300  # one line per rank and step; the start line is not counted
    text = at_scale(1.0, 250.0)
    assert "at 1,024 nodes x 8 ranks, 1 s a step: 8,192 appends/s (2.0 MB/s) in all, 8/s per node" in text


def test_a_full_run_rewrites_the_table_and_keeps_the_notes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = tmp_path / "own_model.md"
    doc.write_text(f"## old table\n\n{NOTES_MARK}\n\n### a note by hand\n", encoding="utf-8")
    monkeypatch.setattr(bench.own_model, "DOC", doc)
    result = {"faults": 3, "recovered": 3, "unfired": 0, "equal_on_disk": 1, "exactly_once": 1,
              "loss_drop": 1.0, "api_overhead": 1.01, "api_ms_per_step": 0.25}  # fmt: skip
    write_doc(result, QUICK, result_line(result), "step events: ...")
    text = doc.read_text(encoding="utf-8")
    assert "## old table" not in text
    assert "| the API's cost per step (the medians' difference) | 0.25 ms |" in text
    assert text.endswith(f"{NOTES_MARK}\n\n### a note by hand\n")
