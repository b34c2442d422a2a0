"""fsdpkit.analysis.metrics on event streams written with the real EventLog; each expectation is worked out
here."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from metrics_fixtures import T0, SyntheticRun, fault_free_run

from fsdpkit.analysis.metrics import (
    MetricsError,
    compute_metrics,
    goodput_over,
    load_run_metrics,
    time_budget,
)
from fsdpkit.runtime.events import events_dir, read_events


def test_fault_free_async_run(tmp_path: Path) -> None:
    dur, first, stall, drain, write = 0.5, 2.0, 0.05, 0.4, 1.0
    fault_free_run(tmp_path, steps=10, dur=dur, first_dur=first, interval=5, stall=stall, write=write)
    m = load_run_metrics(tmp_path)

    wall = 3.0 + first + 9 * dur + 2 * stall + drain  # setup, steps, two stalls, final drain
    assert m.world_size == 2
    assert m.finished
    assert m.wall_s == pytest.approx(wall)
    assert (m.steps_completed, m.steps_computed, m.lost_steps) == (10, 10, 0)
    assert m.median_step_s == pytest.approx(dur)
    assert m.stall_s == pytest.approx(2 * stall)  # one rank's stalls, not both ranks' summed
    assert m.drain_s == pytest.approx(drain)
    assert m.checkpoint_write_s == pytest.approx(2 * write)
    assert m.efficiency == pytest.approx(1 - 2 * stall / wall)
    assert (m.checkpoints_committed, m.checkpoints_failed) == (2, 0)
    assert m.faults == [] and m.recovery_s_total == 0.0
    assert m.goodput == pytest.approx(10 * dur / wall)
    assert m.training_goodput == pytest.approx((first + 9 * dur) / wall)
    assert m.infra_goodput == pytest.approx(1.0)
    assert (m.attempts, m.restarts, m.inprocess_restarts) == (1, 0, 0)


def test_kill_detected_by_launcher_then_resumed_from_disk(tmp_path: Path) -> None:
    run = SyntheticRun(tmp_path)
    run.start_attempt(0, T0, resume_step=None)
    t = run.steps(1, 10, T0 + 3.0, 0.5, first_dur=2.0)
    run.ckpt(10, "stall", t + 0.05, 0.05)
    t += 0.05
    run.ckpt(10, "commit", t + 1.0, 0.0, ranks=[0])
    t = run.steps(11, 12, t, 0.5)
    fault_ts = t + 0.1
    run.fault("kill", 13, 1, fault_ts)
    run.launcher_event(
        "worker_failed", fault_ts + 0.2, local_rank=1, global_rank=1, exitcode=-9, reason="SIGKILL"
    )
    run.launcher_event("restart", fault_ts + 0.3, attempt=1, reason="worker_failed", remaining=2)
    run.start_attempt(1, fault_ts + 3.0, resume_step=10, resume_ts=fault_ts + 4.0)
    t = run.steps(11, 20, fault_ts + 4.1, 0.5, first_dur=0.9)
    run.end(20, t)
    run.close()

    m = load_run_metrics(tmp_path)
    wall = t - T0
    assert m.wall_s == pytest.approx(wall)
    assert (m.steps_completed, m.steps_computed, m.lost_steps) == (20, 22, 2)
    assert m.median_step_s == pytest.approx(0.5)  # the two first-after-start steps (2.0, 0.9) are excluded
    assert (m.attempts, m.restarts) == (2, 1)
    [f] = m.faults
    assert (f.kind, f.step, f.rank) == ("kill", 13, 1)
    assert f.ts == pytest.approx(fault_ts)
    assert f.detected_by == "worker_failed"
    assert f.detect_s == pytest.approx(0.2)
    assert f.recovery_s == pytest.approx(4.1 + 0.9)  # fault -> end of step 11 after the resume
    assert f.downtime_s == pytest.approx(4.1)  # fault -> start of that step
    assert (f.resume_step, f.resume_source, f.lost_steps) == (10, "shared", 2)
    assert m.faults_recovered == 1
    assert m.recovery_s_total == pytest.approx(5.0)
    assert m.infra_goodput == pytest.approx((wall - 4.1) / wall)
    assert m.goodput == pytest.approx(20 * 0.5 / wall)
    assert m.training_goodput == pytest.approx((2.0 + 11 * 0.5 + 0.9 + 9 * 0.5) / wall)
    assert m.checkpoints_committed == 1


def test_goodput_over_the_job_wall_and_where_the_time_went(tmp_path: Path) -> None:
    """A benchmark's own clock (launch to exit) is longer than the events' wall; the budget adds up to it."""
    run = SyntheticRun(tmp_path)
    run.start_attempt(0, T0, resume_step=None)
    t = run.steps(1, 10, T0 + 3.0, 0.5, first_dur=2.0)
    run.ckpt(10, "stall", t + 0.25, 0.25)
    t = run.steps(11, 12, t + 0.25, 0.5)
    fault_ts = t + 0.1
    run.fault("kill", 13, 1, fault_ts)
    run.start_attempt(1, fault_ts + 3.0, resume_step=10, resume_ts=fault_ts + 4.0)
    t = run.steps(11, 20, fault_ts + 4.1, 0.5, first_dur=0.9)
    run.end(20, t)
    run.close()

    m = load_run_metrics(tmp_path)
    assert m.startup_s == pytest.approx(3.0)
    assert m.downtime_s_total == pytest.approx(4.1)
    assert m.step_time_s == pytest.approx(2.0 + 11 * 0.5 + 0.9 + 9 * 0.5)
    job_wall = m.wall_s + 7.0  # 7 s of launcher start-up and exit that no event covers
    g = goodput_over(m, job_wall)
    assert g.strict == pytest.approx(20 * 0.5 / job_wall)
    assert g.training == pytest.approx(m.step_time_s / job_wall)
    assert g.infra == pytest.approx((job_wall - 4.1) / job_wall)
    assert goodput_over(m, m.wall_s).strict == pytest.approx(m.goodput)
    b = time_budget(m, job_wall)
    assert (b.useful_s, b.replay_s) == (pytest.approx(10.0), pytest.approx(1.0))
    assert b.slow_steps_s == pytest.approx((2.0 - 0.5) + (0.9 - 0.5))
    assert (b.checkpoint_s, b.downtime_s, b.startup_s) == (pytest.approx(0.25), pytest.approx(4.1), 3.0)
    assert b.outside_s == pytest.approx(7.0)
    assert b.other_s == pytest.approx(0.1)  # the fault fired 0.1 s after step 12 ended
    parts = dataclasses.asdict(b)
    assert sum(v for k, v in parts.items() if k != "wall_s") == pytest.approx(job_wall)


def test_hang_detected_by_heartbeat(tmp_path: Path) -> None:
    run = SyntheticRun(tmp_path)
    run.start_attempt(0, T0, resume_step=None)
    t = run.steps(1, 5, T0 + 1.0, 0.5)
    run.ckpt(5, "commit", t + 0.5, 0.0, ranks=[0])
    t = run.steps(6, 7, t, 0.5)
    run.fault("hang", 8, 1, t)
    run.launcher_event("hang_detected", t + 5.5, global_rank=1, stale_s=5.5, timeout_s=5.0, phase="train")
    run.launcher_event("restart", t + 5.6, attempt=1, reason="hang", remaining=2)
    run.start_attempt(1, t + 7.0, resume_step=5, resume_ts=t + 8.0)
    end = run.steps(6, 10, t + 8.2, 0.5)
    run.end(10, end)
    run.close()

    [f] = load_run_metrics(tmp_path).faults
    assert (f.kind, f.detected_by) == ("hang", "hang_detected")
    assert f.detect_s == pytest.approx(5.5)
    assert f.recovery_s == pytest.approx(8.2 + 0.5)
    assert f.lost_steps == 7 - 5


def test_inprocess_restart_from_memory(tmp_path: Path) -> None:
    run = SyntheticRun(tmp_path)
    run.start_attempt(0, T0, resume_step=None)
    t = run.steps(1, 6, T0 + 1.0, 0.5)
    run.fault("exception", 7, 1, t)
    for rank in (0, 1):  # restart began at t + 0.5 and took 1.0 s
        run.logs[rank].emit(
            "inprocess_restart",
            ts=t + 1.5,
            reason="exception",
            restored_step=5,
            source="memory",
            duration_s=1.0,
        )
    end = run.steps(6, 12, t + 1.6, 0.5, first_dur=0.6)
    run.end(12, end)
    run.close()

    m = load_run_metrics(tmp_path)
    [f] = m.faults
    assert (f.detected_by, f.resume_source, f.resume_step) == ("inprocess", "memory", 5)
    assert f.detect_s == pytest.approx(0.5)
    assert f.recovery_s == pytest.approx(1.6 + 0.6)
    assert f.downtime_s == pytest.approx(1.6)
    assert f.lost_steps == 1  # step 6 was computed before the fault and again after
    assert (m.inprocess_restarts, m.restarts, m.attempts) == (1, 0, 1)
    assert (m.steps_completed, m.steps_computed, m.lost_steps) == (12, 13, 1)


def test_median_excludes_the_first_step_of_every_process_and_restart(tmp_path: Path) -> None:
    run = SyntheticRun(tmp_path, world_size=1)
    run.start_attempt(0, T0, resume_step=None)
    t = run.steps(1, 2, T0 + 1.0, 0.5, first_dur=3.0)
    run.logs[0].emit(
        "inprocess_restart", ts=t + 1.0, reason="x", restored_step=1, source="memory", duration_s=1.0
    )
    t = run.steps(2, 3, t + 1.0, 0.5, first_dur=3.0)
    run.start_attempt(1, t + 1.0, resume_step=2)
    t = run.steps(3, 4, t + 2.0, 0.6, first_dur=3.0)
    run.end(4, t)
    run.close()

    m = load_run_metrics(tmp_path)
    # kept: 0.5 (step 2), 0.5 (step 3), 0.6 (step 4); a median over all six would be (0.6 + 3.0) / 2
    assert m.median_step_s == pytest.approx(0.5)
    assert (m.steps_completed, m.steps_computed) == (4, 6)


def test_sync_stalls_and_a_failed_checkpoint(tmp_path: Path) -> None:
    run = SyntheticRun(tmp_path)
    run.start_attempt(0, T0, resume_step=None, ckpt_mode="sync")
    t = T0 + 1.0
    stalls = {5: 2.0, 10: 2.5, 15: 0.3}
    for step, stall in stalls.items():
        t = run.steps(step - 4, step, t, 0.5)
        run.ckpt(step, "stall", t + stall, stall, ranks=[0])
        run.ckpt(step, "stall", t + stall, stall + 0.1, ranks=[1])  # another rank's view of the same stall
        t += stall
        if step == 15:
            run.ckpt(step, "failed", t, 0.0, ranks=[0, 1])
        else:
            run.ckpt(step, "commit", t, 0.0, ranks=[0])
    run.end(15, t)
    run.close()

    m = load_run_metrics(tmp_path)
    wall = t - T0
    assert m.stall_s == pytest.approx(sum(stalls.values()))
    assert m.efficiency == pytest.approx(1 - sum(stalls.values()) / wall)
    assert (m.checkpoints_committed, m.checkpoints_failed) == (
        2,
        1,
    )  # one failure, though both ranks logged it
    assert m.drain_s == 0.0


def test_two_faults_each_match_their_own_resume(tmp_path: Path) -> None:
    run = SyntheticRun(tmp_path)
    run.start_attempt(0, T0, resume_step=None)
    t = run.steps(1, 8, T0 + 1.0, 0.5)
    f1 = t
    run.fault("kill", 9, 1, f1)
    run.launcher_event("worker_failed", f1 + 0.1, local_rank=1, global_rank=1, exitcode=-9, reason="signal")
    run.start_attempt(1, f1 + 2.0, resume_step=5, resume_ts=f1 + 3.0)
    t = run.steps(6, 12, f1 + 3.0, 0.5)
    f2 = t
    run.fault("exception", 13, 1, f2)
    for rank in (0, 1):
        run.logs[rank].emit(
            "inprocess_restart",
            ts=f2 + 0.8,
            reason="exception",
            restored_step=10,
            source="memory",
            duration_s=0.5,
        )
    t = run.steps(11, 16, f2 + 0.8, 0.5)
    run.end(16, t)
    run.close()

    m = load_run_metrics(tmp_path)
    first, second = m.faults
    assert (first.detected_by, first.resume_step, first.lost_steps) == ("worker_failed", 5, 8 - 5)
    assert first.recovery_s == pytest.approx(3.5)
    assert (second.detected_by, second.resume_step, second.lost_steps) == ("inprocess", 10, 12 - 10)
    assert second.detect_s == pytest.approx(0.3)
    assert second.recovery_s == pytest.approx(1.3)
    assert m.recovery_s_total == pytest.approx(3.5 + 1.3)
    assert (m.steps_completed, m.steps_computed, m.lost_steps) == (16, 8 + 7 + 6, 8 + 7 + 6 - 16)


def test_torn_last_line_is_ignored(tmp_path: Path) -> None:
    fault_free_run(tmp_path)
    before = load_run_metrics(tmp_path)
    [rank0] = [p for p in events_dir(tmp_path).glob("trainer-rank0-*.jsonl")]
    with open(rank0, "a", encoding="utf-8") as fh:
        fh.write('{"ts": 1700000099.0, "kind": "step", "role": "trainer", "rank": 0, "st')  # killed mid-write
    assert load_run_metrics(tmp_path) == before


def test_a_run_that_died_has_metrics_up_to_its_last_event(tmp_path: Path) -> None:
    run = SyntheticRun(tmp_path)
    run.start_attempt(0, T0, resume_step=None)
    t = run.steps(1, 7, T0 + 1.0, 0.5)
    run.fault("kill", 8, 1, t)
    run.launcher_event("exit", t + 1.0, code=75, reason="restart budget exhausted")
    run.close()

    m = load_run_metrics(tmp_path)
    assert not m.finished
    assert m.wall_s == pytest.approx(t - T0)  # to the last trainer event
    assert (m.steps_completed, m.faults_recovered) == (7, 0)
    [f] = m.faults
    assert f.recovery_s is None and f.detect_s is None and f.downtime_s is None


def test_no_checkpoints_and_no_faults(tmp_path: Path) -> None:
    run = SyntheticRun(tmp_path, world_size=1)
    run.start_attempt(0, T0, resume_step=None, ckpt_mode="off")
    t = run.steps(1, 4, T0 + 1.0, 0.25)
    run.end(4, t)
    run.close()

    m = compute_metrics(read_events(tmp_path))
    assert (m.stall_s, m.efficiency, m.checkpoints_committed, m.faults) == (0.0, 1.0, 0, [])
    assert m.world_size == 1


def test_bad_run_folders_say_what_to_fix(tmp_path: Path) -> None:
    with pytest.raises(MetricsError, match="does not exist"):
        load_run_metrics(tmp_path / "missing")
    with pytest.raises(MetricsError, match=r"no events/\*\.jsonl"):
        load_run_metrics(tmp_path)
    with pytest.raises(MetricsError, match="no trainer events"):
        compute_metrics([{"ts": T0, "kind": "exit", "role": "launcher", "rank": None}])


def test_one_drain_logged_by_two_layers_counts_once(tmp_path: Path) -> None:
    run = SyntheticRun(tmp_path, world_size=1)
    run.start_attempt(0, T0, resume_step=None)
    t = run.steps(1, 4, T0 + 1.0, 0.5)
    run.ckpt(4, "drain", t, 0.7)  # the checkpointer's wait(), stamped at its start
    run.ckpt(4, "drain", t + 0.7, 0.7)  # the trainer timing the same wait, stamped at its end
    run.end(4, t + 0.7)
    run.close()
    assert load_run_metrics(tmp_path).drain_s == pytest.approx(0.7)


def test_inprocess_restart_logged_after_its_resume_is_still_the_detector(tmp_path: Path) -> None:
    run = SyntheticRun(tmp_path)
    run.start_attempt(0, T0, resume_step=None)
    t = run.steps(1, 9, T0 + 1.0, 0.5)
    run.fault("exception", 10, 1, t)
    for rank, began in ((0, t + 0.4), (1, t + 0.1)):  # rank 1 raised; rank 0 saw the broken collective later
        run.logs[rank].emit("resume", ts=t + 1.0, step=8, source="memory", duration_s=0.2, fallback_from=None)
        run.logs[rank].emit(
            "inprocess_restart",
            ts=t + 1.3,
            reason="x",
            restored_step=8,
            source="memory",
            duration_s=t + 1.3 - began,
        )
    end = run.steps(9, 12, t + 1.3, 0.5)
    run.end(12, end)
    run.close()

    [f] = load_run_metrics(tmp_path).faults
    assert (f.detected_by, f.resume_source, f.resume_step) == ("inprocess", "memory", 8)
    assert f.detect_s == pytest.approx(0.1)  # the earliest rank to start restarting
    assert f.recovery_s == pytest.approx(1.8)


def test_malformed_events_are_skipped_and_counted(tmp_path: Path) -> None:
    fault_free_run(tmp_path)
    before = load_run_metrics(tmp_path)
    events = read_events(tmp_path)
    bad = [
        {"ts": T0 + 5, "kind": "step", "role": "trainer", "rank": 0},  # no step number
        {"ts": "soon", "kind": "step", "role": "trainer", "rank": 0, "step": 3},
        {"kind": "end", "role": "trainer", "rank": 0, "step": 99},  # no timestamp
        ["not", "an", "event"],
    ]
    m = compute_metrics(events + bad)
    assert m.events_skipped == len(bad)
    assert dataclasses.replace(m, events_skipped=0) == before


def test_throughput_is_the_median_of_the_steps_and_absent_without_it() -> None:
    def ev(kind: str, ts: float, **kw) -> dict:
        return {"ts": ts, "kind": kind, "role": "trainer", "rank": 0, "attempt": 0, "pid": 1} | kw

    rates, mfus = [900.0, 1000.0, 1100.0, 5000.0], [0.40, 0.41, 0.43, 0.90]
    steps = [
        ev("step", 10.0 + i, step=i + 1, duration_s=1.0, t_start=9.0 + i, tokens_per_s=r, mfu=u)
        for i, (r, u) in enumerate(zip(rates, mfus, strict=True))
    ]
    events = [ev("start", 9.0, world_size=1), *steps, ev("end", 14.0, step=4)]
    m = compute_metrics(events)
    assert m.tokens_per_s == pytest.approx(1050.0) and m.mfu == pytest.approx(0.42)
    bare = [{k: v for k, v in e.items() if k not in ("tokens_per_s", "mfu")} for e in events]
    m = compute_metrics(bare)
    assert m.tokens_per_s is None and m.mfu is None


def test_a_restore_counts_as_the_dearest_source_any_rank_used() -> None:
    """The job waits for its slowest rank: one rank's shared read makes the restore a shared one."""
    from fsdpkit.analysis.metrics import restore_source

    assert restore_source(["memory", "memory"]) == "memory"
    assert restore_source(["memory", "peer"]) == "peer"
    assert restore_source(["peer", "shared", "memory"]) == "shared"
    assert restore_source(["disk"]) == "shared"  # runs from before the memory tiers
    assert restore_source(["live", None, "bogus"]) == "live"
    assert restore_source([]) is None
