"""Heartbeat protocol end to end on real files: the worker-side client writes, the launcher-side monitor
judges (phases, learned timeouts, leftovers). Times are passed explicitly (`check(now=...)`), so nothing
here sleeps or depends on the machine's speed."""

from __future__ import annotations

import json
import os
import time
import types
from pathlib import Path

import pytest

import fsdpkit.runtime.heartbeat
from fsdpkit.launcher.monitor import HeartbeatMonitor, HeartbeatSettings, TimeoutLearner
from fsdpkit.runtime.heartbeat import HEARTBEAT_DIR_ENV, HeartbeatClient, heartbeat_path


def _settings(**kw: float | None) -> HeartbeatSettings:
    base: dict = {"timeout_s": None, "load_timeout_s": 60.0, "safety_factor": 1.5, "min_timeout_s": 0.5}
    base.update(kw)
    return HeartbeatSettings(**base)


def test_learner_takes_the_slowest_recent_step_times_the_factor_with_a_floor() -> None:
    learner = TimeoutLearner(safety_factor=1.5, min_timeout_s=0.5)
    for rank in (0, 1):
        for _ in range(TimeoutLearner.PROVISIONAL_STEPS - 1):
            learner.observe(0.4, rank=rank)
    assert learner.timeout_s is None  # too few steps on any rank: the load allowance applies
    for rank in (0, 1):
        for _ in range(TimeoutLearner.MIN_STEPS - TimeoutLearner.PROVISIONAL_STEPS):
            learner.observe(0.4, rank=rank)
    assert learner.timeout_s == pytest.approx(1.2)  # provisional: twice the learned value
    learner.observe(0.4, rank=0)
    assert learner.timeout_s == pytest.approx(0.6)
    learner.observe(0.8, rank=1)  # a step that overlapped a background save: never a false restart
    assert learner.timeout_s == pytest.approx(1.2)
    for _ in range(TimeoutLearner.WINDOW):
        learner.observe(0.4, rank=0)
    assert learner.timeout_s == pytest.approx(0.6)  # ... and it ages out of the window
    fast = TimeoutLearner(safety_factor=1.5, min_timeout_s=0.5)
    for _ in range(TimeoutLearner.MIN_STEPS):
        fast.observe(0.01, rank=0)
    assert fast.timeout_s == 0.5  # the floor guards tiny steps


def test_client_is_a_no_op_without_a_launcher(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(HEARTBEAT_DIR_ENV, raising=False)
    monkeypatch.delenv("FT_RANK_MONITOR_IPC_SOCKET", raising=False)
    client = HeartbeatClient.from_env()
    client.phase("load")
    client.beat(1)
    client.close()
    assert not client.enabled
    with pytest.raises(ValueError, match="heartbeat phase 'resting' is not one of"):
        client.phase("resting")  # type: ignore[arg-type]


def test_phases_learning_and_staleness(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monitor = HeartbeatMonitor(tmp_path, _settings())
    directory = monitor.reset([0, 1])
    t0 = time.time()
    assert monitor.check(now=t0 + 59) is None  # no file yet: "start" has the load allowance
    stale = monitor.check(now=t0 + 61)
    assert stale is not None and stale.phase == "start" and stale.timeout_s == 60.0

    monkeypatch.setenv(HEARTBEAT_DIR_ENV, str(directory))
    clients = {}
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        clients[rank] = HeartbeatClient.from_env()
        clients[rank].phase("load")
        clients[rank].phase("train")  # after the load: the first step still has the allowance
    now = time.time()
    assert monitor.check(now=now + 30) is None
    for step in range(1, 22):
        for client in clients.values():
            client.beat(step)
        if step == 11:
            monitor.check()
    monitor.check()
    assert monitor.learner.samples == 2 * 20  # every step time, though polled twice (up to 16 steps apart)
    learned = monitor.step_timeout_s()
    assert 0.5 <= learned < 60
    last = time.time()
    assert monitor.check(now=last + learned * 0.9) is None
    stale = monitor.check(now=last + learned + 0.5)
    assert stale is not None and stale.phase == "train" and stale.step == 21 and stale.timeout_s == learned

    clients[1].phase("checkpoint")  # a save: allowance again, and the save is not a step sample
    clients[0].close()  # finished: never stale
    samples = monitor.learner.samples
    monitor.check()
    assert monitor.learner.samples == samples + 1  # the training part of rank 1's step in progress
    assert monitor.check(now=time.time() + 30) is None
    stale = monitor.check(now=time.time() + 61)
    assert stale is not None and stale.rank == 1 and stale.phase == "checkpoint"


def test_explicit_timeout_and_a_worker_of_the_old_attempt_that_beats_after_the_restart(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each attempt beats into its own folder: a worker of the failed attempt that is killed late (under
    the zygote, a moment after its shim) and beats meanwhile is not taken for the new rank."""
    monitor = HeartbeatMonitor(tmp_path, _settings(timeout_s=3.0))
    monkeypatch.setenv("RANK", "0")
    (tmp_path / "attempt_2").mkdir()
    (tmp_path / "attempt_2" / "rank_0.json").write_text("{}")  # left by an earlier launcher
    first = monitor.reset([0])
    monkeypatch.setenv(HEARTBEAT_DIR_ENV, str(first))
    old = HeartbeatClient.from_env()
    old.beat(1)
    second = monitor.reset([0])  # the restart
    assert second != first and not heartbeat_path(second, 0).exists()
    monkeypatch.setenv(HEARTBEAT_DIR_ENV, str(second))
    new = HeartbeatClient.from_env()  # "start"
    old.beat(2)  # the old worker, not killed yet
    assert monitor.check(now=time.time() + 10) is None  # the new rank's load allowance, not 3 s of "train"
    (seen,) = monitor.silent(time.time())
    assert seen.phase == "start" and seen.step is None
    new.beat(3)
    new.beat(4)
    now = time.time()
    assert monitor.check(now=now + 2.9) is None
    stale = monitor.check(now=now + 3.2)
    assert stale is not None and stale.timeout_s == 3.0 and stale.step == 4
    assert monitor.pid(0) == os.getpid()
    monitor.reset([0])
    assert not first.exists() and second.exists()  # the attempt before the last is removed


def test_the_step_after_a_save_is_learned_and_allowed_apart(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The first step after a save overlaps its background write and runs slow; it gets its own allowance,
    so the ordinary steps' timeout (and with it the time to find a real hang) does not follow it."""
    clock = types.SimpleNamespace(now=time.time())
    monkeypatch.setattr(fsdpkit.runtime.heartbeat, "time", types.SimpleNamespace(time=lambda: clock.now))
    monkeypatch.setenv("RANK", "0")
    monitor = HeartbeatMonitor(tmp_path, _settings(min_timeout_s=0.01))
    directory = monitor.reset([0])
    monkeypatch.setenv(HEARTBEAT_DIR_ENV, str(directory))
    client = HeartbeatClient.from_env()
    client.phase("train")

    def after(seconds: float) -> float:
        clock.now += seconds
        return clock.now

    step = 0
    while step < 29:
        step += 1
        after(0.1)
        if step % 5 == 0:  # a save: announced, handed off, then one slow step that overlaps the write
            client.phase("checkpoint")
            after(0.05)
            client.beat(step)
            record = json.loads(heartbeat_path(directory, 0).read_text())
            assert record["ts"] == record["since"]  # what tells the launcher "the next step overlaps a write"
            if step == 5:  # nothing learned about such steps yet: the load allowance
                assert monitor.check(now=clock.now + 59) is None
            assert monitor.check(now=clock.now + 0.05) is None  # the launcher polls during that step
            step += 1
            after(0.4)  # 4 x an ordinary step
        client.beat(step)
        assert monitor.check(now=clock.now + 0.05) is None
    learner = monitor.learner
    assert learner.timeout_s == pytest.approx(1.5 * 0.1)  # ordinary steps only: a hang is found in 1.5 steps
    assert learner.after_checkpoint_timeout_s == pytest.approx(1.5 * 0.4)
    last = clock.now
    assert monitor.check(now=last + 0.14) is None
    stale = monitor.check(now=last + 0.16)  # an ordinary step past 1.5 x the slowest ordinary one: a hang
    assert stale is not None and stale.timeout_s == pytest.approx(0.15)
    client.phase("checkpoint")
    client.beat(30)
    assert monitor.check(now=clock.now + 0.5) is None  # the step after this save has its own allowance
    stale = monitor.check(now=clock.now + 0.61)
    assert stale is not None and stale.timeout_s == pytest.approx(0.6)


def test_learner_keeps_after_checkpoint_steps_out_of_the_ordinary_timeout() -> None:
    learner = TimeoutLearner(safety_factor=1.5, min_timeout_s=0.1)
    for _ in range(TimeoutLearner.MIN_STEPS):
        learner.observe(0.2, rank=0)
    learner.observe(0.9, rank=0, after_checkpoint=True)
    assert learner.timeout_s == pytest.approx(0.3)
    assert learner.after_checkpoint_timeout_s == pytest.approx(1.35)
    only_after = TimeoutLearner(safety_factor=1.5, min_timeout_s=0.1)
    for _ in range(TimeoutLearner.MIN_STEPS):
        only_after.observe(0.5, rank=0, after_checkpoint=True)
    assert only_after.timeout_s == pytest.approx(0.75)  # nothing else seen: the only evidence there is
