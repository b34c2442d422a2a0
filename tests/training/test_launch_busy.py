"""The launcher's busy check end to end (tests/training/launch_worker.py on gloo): a rank that computes past
its timeout is given more time, a hung rank and its peer waiting in a collective are not."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_launch_recovery import expected_value, final_value, launch, launcher_events

from fsdpkit.contracts import exitcodes

pytestmark = pytest.mark.slow


def test_a_rank_busy_past_its_timeout_is_not_restarted_a_hung_one_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rank 1 computes for 1.6 s in step 6 (timeout 1 s, busy cap 3 s), then hangs in step 12.
    monkeypatch.setenv("KIT_TEST_SPIN", "6:1.6:1")
    proc, run = launch(
        tmp_path,
        ["--heartbeat-timeout", "1", "--heartbeat-load-timeout", "60"],
        steps=16,
        faults="hang:step=12:rank=1",
    )
    assert proc.returncode == exitcodes.OK, proc.stderr[-3000:]
    assert final_value(run) == expected_value(16, 2)
    (extended,) = launcher_events(run, "busy_extension")
    assert extended["stale_s"] > extended["timeout_s"] == 1.0  # without the busy check: a false restart
    assert 1 in extended["busy_ranks"] and extended["step"] == 5
    assert "a slow step, not a hang" in proc.stderr
    (hang,) = launcher_events(run, "hang_detected")
    assert hang["global_rank"] == 1 and hang["step"] == 11
    # The hung rank sleeps and its peer waits in gloo: neither is busy, so no cap was needed to find it.
    assert hang["busy_ranks"] == []
    assert [e["reason"] for e in launcher_events(run, "restart")] == ["hang of rank 1"]
