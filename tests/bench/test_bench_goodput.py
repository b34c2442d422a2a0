"""bench.goodput end to end on a tiny run: real launchers, real faults, the RESULT line and the doc section.

A smoke check only (20 steps, one scheduled exception, kit and torchrun; ft_launcher is left out to keep the
test short, so vs_ft_launcher is nan): no timing and no goal is asserted; the figures come from `make bench`.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.goodput import PlanCheck, result_line

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_goodput_smoke_prints_result_and_renders_doc(tmp_path: Path) -> None:
    doc = tmp_path / "goodput.md"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}  # /tmp: short AF_UNIX paths
    proc = subprocess.run(
        [sys.executable, "-m", "bench.goodput", "--smoke", "--doc", str(doc)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    fields = dict(re.findall(r"(\w+)=(\S+)", last))
    assert last.startswith("RESULT ")
    assert set(fields) == {
        "kit_goodput", "vs_ft_launcher", "vs_torchrun", "unfired", "plan_error", "plan_miss", "plan_spread",
        "calibration",
    }  # fmt: skip
    assert fields.pop("vs_ft_launcher") == "nan"
    assert fields.pop("unfired") == "0", proc.stdout[-3000:]  # every planned fault fired
    # the smoke run predicts from the committed calibration (a same-run one would double its time): a
    # figure for each mechanism that ran, and the range its 3 repetitions give (their size is the
    # benchmark's goal, not a test's: it depends on the machine's speed)
    assert fields.pop("calibration") == "file"
    for name in ("plan_error", "plan_miss", "plan_spread"):
        assert 0 <= float(fields.pop(name)) < 1, proc.stdout[-3000:]
    for value in fields.values():
        assert value != "-" and math.isfinite(float(value)) and float(value) > 0, proc.stdout[-3000:]
    text = doc.read_text(encoding="utf-8")
    predicted = [line for line in text.splitlines() if line.startswith(("| kit | 0.", "| torchrun | 0."))]
    assert len(predicted) == 2, text  # measured, predicted, error and the predicted wall's parts
    rows = [line for line in text.splitlines() if line.startswith("| kit |")]
    assert len(rows) == 3  # the figures row, the time-budget row and the plan's prediction
    assert "| torchrun |" in text and last in text
    assert (tmp_path / "goodput_timeline.png").stat().st_size > 0


def _check(measured: float, low: float, high: float) -> PlanCheck:
    parts = {"overhead": 3.0, "steps": 40.0, "replay": 0.0, "saves": 1.0, "faults": 2.0}
    return PlanCheck(
        label="kit", measured=measured, predicted=(low + high) / 2, parts_s=parts, low=low, high=high
    )


def test_the_result_line_carries_the_predicted_range() -> None:
    """A measurement inside its range misses by 0, one outside by its distance to the nearer end; the
    RESULT keeps its fields and adds the range's."""
    inside, above = _check(0.85, 0.84, 0.86), _check(0.90, 0.80, 0.86)
    assert inside.miss == 0.0 and above.miss == pytest.approx(0.04) and _check(0.70, 0.75, 0.8).miss > 0
    line = result_line({}, [inside, above], calibration="run")
    fields = dict(re.findall(r"(\w+)=(\S+)", line))
    assert fields["plan_error"] == "0.070" and fields["plan_miss"] == "0.040"
    assert fields["plan_spread"] == "0.060" and fields["calibration"] == "run"
    assert result_line({}).endswith("plan_error=nan plan_miss=nan plan_spread=nan calibration=file")
