"""`make test`'s runner refuses a value it did not understand before it starts any pytest."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--workers", "0"], "'0'"),
        (["--workers", "nan"], "'nan'"),
        (["--workers", "two"], "'two'"),
        (["--nice", "20"], "'20'"),
        (["--nice", "-1"], "'-1'"),
        (["--bogus"], "--bogus"),
    ],
)
def test_a_bad_value_is_one_line_and_exit_2_before_any_test_runs(argv: list[str], named: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tools.run_tests", *argv], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""  # no pytest started: it would print its session header
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in proc.stderr, proc.stderr
