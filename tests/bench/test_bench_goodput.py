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
    assert set(fields) == {"kit_goodput", "vs_ft_launcher", "vs_torchrun", "unfired", "plan_error"}
    assert fields.pop("vs_ft_launcher") == "nan"
    assert fields.pop("unfired") == "0", proc.stdout[-3000:]  # every planned fault fired
    # the plan's prediction from the committed calibration: a figure for each mechanism that ran (its size is
    # the benchmark's goal, not a test's: it depends on the machine's speed)
    assert 0 <= float(fields.pop("plan_error")) < 1, proc.stdout[-3000:]
    for value in fields.values():
        assert value != "-" and math.isfinite(float(value)) and float(value) > 0, proc.stdout[-3000:]
    text = doc.read_text(encoding="utf-8")
    predicted = [line for line in text.splitlines() if line.startswith(("| kit | 0.", "| torchrun | 0."))]
    assert len(predicted) == 2, text  # measured, predicted, error and the predicted wall's parts
    rows = [line for line in text.splitlines() if line.startswith("| kit |")]
    assert len(rows) == 3  # the figures row, the time-budget row and the plan's prediction
    assert "| torchrun |" in text and last in text
    assert (tmp_path / "goodput_timeline.png").stat().st_size > 0
