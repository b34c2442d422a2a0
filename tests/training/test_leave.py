"""Leaving without the interpreter's teardown keeps what a clean exit does: output, atexit, the code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("code", "expected"), [("None", 0), ("7", 7)])
def test_leave_flushes_runs_atexit_and_exits_with_the_code(code: str, expected: int) -> None:
    script = (
        "import atexit, sys\n"
        "from fsdpkit.runtime.process_exit import leave\n"
        "atexit.register(lambda: print('atexit ran'))\n"
        "sys.stdout.write('buffered, not flushed')\n"
        f"leave({code})\n"
    )
    cmd = [sys.executable, "-c", script]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == expected, "None is 0, as for sys.exit"
    assert proc.stdout == "buffered, not flushedatexit ran\n" and proc.stderr == ""
