"""Single-process checkpoint behaviour: commit records, verification, fallback, retention, memory copy.

Real files, a real model and optimizer, no mocks; world size 1 (the 2-rank cases are in test_ckpt_dist).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import pytest
import torch
from ckpt_worker import App, local_tensors

from fsdpkit.resilience.checkpoint.checkpointer import UNDECLARED, Checkpointer
from fsdpkit.resilience.checkpoint.commit import (
    CommitRecord,
    CommitRefused,
    FileEntry,
    expected_files,
    merge_rank_files,
    read_commit,
    verify_file,
)
from fsdpkit.resilience.checkpoint.config import CheckpointConfig
from fsdpkit.resilience.checkpoint.layout import list_steps, step_dir
from fsdpkit.resilience.checkpoint.planner import cached_plan_keys
from fsdpkit.resilience.checkpoint.reshard import ReshardPolicy
from fsdpkit.resilience.checkpoint.resume import CheckpointError, check_world_size
from fsdpkit.resilience.checkpoint.retention import plan_deletions
from fsdpkit.runtime.events import EventLog, read_events


def _train(tmp_path: Path, *, steps: int, mode: str = "sync", keep: int = 10, interval: int = 1) -> App:
    app = App(seed=0, mesh=None)
    ckpt = Checkpointer(
        CheckpointConfig(mode=mode, interval=interval, keep=keep),
        run_dir=tmp_path,
        rank=0,
        world_size=1,
        events=EventLog(tmp_path, role="trainer", rank=0),
    )
    for step in range(1, steps + 1):
        app.train_step(step, 0)
        ckpt.maybe_save(step, {"app": app})
    ckpt.close()
    return app


def _resume(tmp_path: Path) -> tuple[int | None, App]:
    app = App(seed=7, mesh=None)
    ckpt = Checkpointer(
        CheckpointConfig(mode="sync"),
        run_dir=tmp_path,
        rank=0,
        world_size=1,
        events=EventLog(tmp_path, role="trainer", rank=0),
    )
    try:
        return ckpt.load({"app": app}), app
    finally:
        ckpt.close()


def _shard(tmp_path: Path, step: int) -> Path:
    return step_dir(tmp_path / "checkpoints", step) / "__0_0.distcp"


def _flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0xFF]))


def test_commit_record_lists_every_file_with_size_and_checksum(tmp_path: Path) -> None:
    _train(tmp_path, steps=2, interval=2)
    folder = step_dir(tmp_path / "checkpoints", 2)
    record = read_commit(folder)
    assert (record.step, record.world_size) == (2, 1)
    assert set(record.files) == {".metadata", "__0_0.distcp"}
    for name, entry in record.files.items():
        assert entry.size == (folder / name).stat().st_size
        assert verify_file(folder, name, entry, checksum=True) is None


def test_truncated_and_flipped_files_fail_verification(tmp_path: Path) -> None:
    _train(tmp_path, steps=2, interval=2)
    folder = step_dir(tmp_path / "checkpoints", 2)
    entry = read_commit(folder).files["__0_0.distcp"]
    _flip_byte(folder / "__0_0.distcp", entry.size // 2)
    assert verify_file(folder, "__0_0.distcp", entry, checksum=False) is None  # same size
    assert "crc32c" in verify_file(folder, "__0_0.distcp", entry, checksum=True)
    os.truncate(folder / "__0_0.distcp", entry.size - 1)
    assert f"size {entry.size - 1} != recorded {entry.size}" in verify_file(
        folder, "__0_0.distcp", entry, checksum=False
    )


def test_resume_restores_every_tensor_of_the_newest_step(tmp_path: Path) -> None:
    trained = _train(tmp_path, steps=3)
    step, app = _resume(tmp_path)
    assert (step, app.step) == (3, 3)
    want, got = local_tensors(trained), local_tensors(app)
    assert want.keys() == got.keys()
    assert [k for k in want if not torch.equal(want[k], got[k])] == []


def test_damaged_newest_falls_back_with_warning_and_event(tmp_path: Path, caplog) -> None:
    _train(tmp_path, steps=3)
    _flip_byte(_shard(tmp_path, 3), 100)
    with caplog.at_level(logging.WARNING, logger="fsdpkit.resilience.checkpoint"):
        step, app = _resume(tmp_path)
    assert (step, app.step) == (2, 2)
    assert "step_00000003 skipped: damaged (__0_0.distcp: crc32c" in caplog.text
    resumes = [e for e in read_events(tmp_path) if e["kind"] == "resume"]
    assert (resumes[-1]["step"], resumes[-1]["fallback_from"], resumes[-1]["source"]) == (2, 3, "shared")


def test_uncommitted_newest_is_ignored_and_named_once(tmp_path: Path, caplog) -> None:
    _train(tmp_path, steps=3)
    (step_dir(tmp_path / "checkpoints", 3) / "commit.json").unlink()
    with caplog.at_level(logging.WARNING, logger="fsdpkit.resilience.checkpoint"):
        step, _ = _resume(tmp_path)
    assert step == 2
    resumes = [e for e in read_events(tmp_path) if e["kind"] == "resume"]
    assert resumes[-1]["fallback_from"] is None
    (line,) = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert line.endswith("step_00000003 skipped: no commit.json (its save never finished)")


def test_no_verified_checkpoint_fails_loudly_instead_of_step_zero(tmp_path: Path) -> None:
    _train(tmp_path, steps=2, keep=2)
    for step in (1, 2):
        os.truncate(_shard(tmp_path, step), 10)
    with pytest.raises(CheckpointError, match=r"2 committed checkpoint\(s\) in .* but none verifies") as info:
        _resume(tmp_path)
    assert "\n" not in str(info.value)


def test_nothing_committed_starts_fresh(tmp_path: Path) -> None:
    step, app = _resume(tmp_path)
    assert (step, app.step) == (None, 0)


@pytest.mark.parametrize("keep", [2, 3])
def test_retention_keeps_exactly_k(tmp_path: Path, keep: int) -> None:
    _train(tmp_path, steps=7, keep=keep, mode="async")
    root = tmp_path / "checkpoints"
    assert list_steps(root) == list(range(8 - keep, 8))
    assert all((step_dir(root, s) / "commit.json").is_file() for s in list_steps(root))


def test_retention_spares_newest_and_in_flight_and_drops_dead_leftovers(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3, 4, 5):
        step_dir(root, step).mkdir(parents=True)
    for step in (2, 3, 4):
        (step_dir(root, step) / "commit.json").write_text("{}")
    # 1: uncommitted below the newest commit (dead); 5: uncommitted above it (being written)
    assert plan_deletions(root, keep=2, in_flight=5) == [1, 2]
    assert plan_deletions(root, keep=2, in_flight=2) == [1]


def test_memory_copy_is_the_saved_step_not_a_later_one(tmp_path: Path) -> None:
    app = App(seed=0, mesh=None)
    ckpt = Checkpointer(CheckpointConfig(mode="async", interval=2), run_dir=tmp_path, rank=0, world_size=1)
    for step in (1, 2):
        app.train_step(step, 0)
        ckpt.maybe_save(step, {"app": app})
    at_save = local_tensors(app)
    app.train_step(3, 0)  # the optimizer step waits for the host copy, then changes the live state
    assert ckpt.memory_step() == 2
    fresh = App(seed=5, mesh=None)
    assert ckpt.load_from_memory({"app": fresh}) == 2
    ckpt.close()
    got = local_tensors(fresh)
    assert fresh.step == 2
    assert [k for k in at_save if not torch.equal(at_save[k], got[k])] == []
    assert not torch.equal(local_tensors(app)["/model/0.weight"], got["/model/0.weight"])


def test_second_save_of_one_step_is_skipped(tmp_path: Path) -> None:
    app = App(seed=0, mesh=None)
    events = EventLog(tmp_path, role="trainer", rank=0)
    ckpt = Checkpointer(
        CheckpointConfig(mode="sync", interval=2), run_dir=tmp_path, rank=0, world_size=1, events=events
    )
    app.train_step(2, 0)
    assert ckpt.maybe_save(2, {"app": app}) is True
    assert ckpt.maybe_save(2, {"app": app}, force=True) is False
    assert ckpt.maybe_save(3, {"app": app}) is False  # not due
    ckpt.close()
    phases = [e["phase"] for e in read_events(tmp_path) if e["kind"] == "ckpt"]
    assert sorted(phases) == ["commit", "skipped", "stall", "write"]


def _rewrite_record(tmp_path: Path, at_step: int, **changes: object) -> None:
    folder = step_dir(tmp_path / "checkpoints", at_step)
    body = json.loads((folder / "commit.json").read_text())
    body.update(changes)
    (folder / "commit.json").write_text(json.dumps(body))


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        ("record lists no files", "commit.json lists 0 of the 2 files of a 1-rank checkpoint; missing"),
        ("record lists too few", "commit.json lists 1 of the 2 files of a 1-rank checkpoint; missing __0_0"),
        ("record names a file twice", "'__0_0.distcp' is listed twice"),
        ("record is for another step", "commit.json is for step 2"),
        ("shard missing", "__0_0.distcp: missing"),
    ],
)
def test_a_record_that_does_not_describe_the_whole_checkpoint_is_refused(
    tmp_path: Path, caplog, damage: str, why: str
) -> None:
    _train(tmp_path, steps=3)
    folder = step_dir(tmp_path / "checkpoints", 3)
    record = json.loads((folder / "commit.json").read_text())
    if damage == "record lists no files":
        _flip_byte(_shard(tmp_path, 3), 100)  # the case: `"files": {}` over a damaged shard
        _rewrite_record(tmp_path, 3, files={})
    elif damage == "record lists too few":
        _rewrite_record(tmp_path, 3, files={".metadata": record["files"][".metadata"]})
    elif damage == "record names a file twice":
        text = (folder / "commit.json").read_text()
        twice = '"files": {"__0_0.distcp": ' + json.dumps(record["files"]["__0_0.distcp"]) + ", "
        (folder / "commit.json").write_text(text.replace('"files": {', twice, 1))
    elif damage == "record is for another step":
        _rewrite_record(tmp_path, 3, step=2)
    else:
        _shard(tmp_path, 3).unlink()
    with caplog.at_level(logging.WARNING, logger="fsdpkit.resilience.checkpoint"):
        step, _ = _resume(tmp_path)
    assert step == 2
    (line,) = [r.getMessage() for r in caplog.records if "step_00000003 skipped" in r.getMessage()]
    assert why in line, line


@pytest.mark.parametrize(
    ("record", "policy", "why"),
    [
        ({"reshard": None}, ReshardPolicy(global_batch=8), "it predates resharded resume"),
        ({"reshard": "per-rank extras ema"}, ReshardPolicy(), "cannot be resharded (per-rank extras ema)"),
        ({}, ReshardPolicy(global_batch=8), "cannot be resharded (saved by a Checkpointer without a Reshard"),
        ({"reshard": ""}, ReshardPolicy(global_batch=8, problem="per-rank extras"), "this job's state"),
        ({"reshard": ""}, ReshardPolicy(global_batch=8), "its run declared no global batch"),
        (
            {"reshard": "", "global_batch": 16},
            ReshardPolicy(global_batch=8),
            "set training.global_batch=16 to keep it",
        ),
    ],
)
def test_a_checkpoint_of_another_world_size_that_cannot_be_resharded_is_refused_naming_both(
    tmp_path: Path, record: dict[str, object], policy: ReshardPolicy, why: str
) -> None:
    _train(tmp_path, steps=2)
    _rewrite_record(tmp_path, 2, world_size=2, **record)
    with pytest.raises(CheckpointError) as info:
        check_world_size(tmp_path / "checkpoints", 1, policy)
    (line,) = str(info.value).splitlines()
    assert "written by 2 rank(s), this job has 1" in line and why in line, line
    assert "resume it on 2 rank(s), or use a new run.id" in line, line
    with pytest.raises(CheckpointError, match="this job has 1"):  # and again at load time
        _resume(tmp_path)


def test_a_record_of_this_kit_declares_its_global_batch_and_whether_it_reshards(tmp_path: Path) -> None:
    """An older kit's record (no such keys) reads as 'predates resharded resume' (reshard None)."""
    _train(tmp_path, steps=2)
    record = read_commit(step_dir(tmp_path / "checkpoints", 2))
    assert (record.global_batch, record.reshard) == (None, UNDECLARED)  # a Checkpointer used on its own
    _rewrite_record(tmp_path, 2, global_batch=12, reshard="per-rank extras ema")
    record = read_commit(step_dir(tmp_path / "checkpoints", 2))
    assert (record.global_batch, record.reshard) == (12, "per-rank extras ema")
    body = json.loads(record.to_json())
    del body["global_batch"], body["reshard"]
    assert CommitRecord.from_json(json.dumps(body)).reshard is None
    for damaged in (0, -16, 12.5, "16"):  # a hand-edited or damaged record is unreadable, never acted on
        with pytest.raises(ValueError, match="is not a number of samples"):
            CommitRecord.from_json(json.dumps(body | {"global_batch": damaged}))


def test_commit_refuses_any_file_set_but_one_shard_per_rank() -> None:
    entry = FileEntry(size=1, crc32=0)
    good = [{".metadata": entry, "__0_0.distcp": entry}, {"__1_0.distcp": entry}]
    assert set(merge_rank_files(good, 2)) == expected_files(2)
    collision = [{".metadata": entry, "__0_0.distcp": entry}, {"__0_0.distcp": entry}]  # the record
    with pytest.raises(CommitRefused, match=r"rank 1 wrote __0_0\.distcp, expected __1_0\.distcp"):
        merge_rank_files(collision, 2)
    with pytest.raises(CommitRefused, match=r"1 ranks reported files, the world size is 2"):
        merge_rank_files(good[:1], 2)
    with pytest.raises(CommitRefused, match=r"rank 1 wrote nothing"):
        merge_rank_files([good[0], {}], 2)


def test_cached_save_plans_do_not_outlive_their_checkpointer(tmp_path: Path) -> None:
    app = App(seed=0, mesh=None)
    ckpt = Checkpointer(CheckpointConfig(mode="async", interval=1), run_dir=tmp_path, rank=0, world_size=1)
    for step in (1, 2):
        app.train_step(step, 0)
        ckpt.maybe_save(step, {"app": app})
    ckpt.wait()
    key = ckpt._planner._cached_plans_key
    assert key in cached_plan_keys()
    other = Checkpointer(CheckpointConfig(mode="async"), run_dir=tmp_path, rank=0, world_size=1)
    assert other._planner._cached_plans_key != key
    ckpt.close()
    other.close()
    assert key not in cached_plan_keys()


def test_an_abandoned_save_stops_and_never_commits(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("KIT_CKPT_TEST_HOLD", "writing@1")
    app = App(seed=0, mesh=None)
    events = EventLog(tmp_path, role="trainer", rank=0)
    ckpt = Checkpointer(
        CheckpointConfig(mode="async", interval=1), run_dir=tmp_path, rank=0, world_size=1, events=events
    )
    app.train_step(1, 0)
    ckpt.maybe_save(1, {"app": app})  # returns once the save is held at the start of writing
    ckpt.abandon()
    assert ckpt.settle(60)
    ckpt.close(drain=False)
    assert not (step_dir(tmp_path / "checkpoints", 1) / "commit.json").exists()
    (failed,) = [e for e in read_events(tmp_path) if e["kind"] == "ckpt" and e["phase"] == "failed"]
    assert failed["step"] == 1 and failed["error"].startswith("abandoned by an in-process restart")


def _sched_policy(tid: int) -> int:
    """A thread's scheduling policy as the kernel reports it (/proc/<pid>/task/<tid>/stat, field 41)."""
    stat = Path(f"/proc/self/task/{tid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[38])


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
@pytest.mark.parametrize("priority", ["idle", "normal"])
def test_async_writer_runs_in_the_configured_class_and_still_commits(tmp_path: Path, priority: str) -> None:
    app = App(seed=0, mesh=None)
    cfg = CheckpointConfig(mode="async", interval=1, writer_priority=priority)
    ckpt = Checkpointer(cfg, run_dir=tmp_path, rank=0, world_size=1)
    try:
        app.train_step(1, 0)
        assert ckpt.maybe_save(1, {"app": app})
        writer = next(t for t in threading.enumerate() if t.name == "ckpt-writer-rank0")
        ckpt.wait()
        policy = _sched_policy(writer.native_id)
    finally:
        ckpt.close()
    assert policy == (os.SCHED_IDLE if priority == "idle" else os.SCHED_OTHER)
    assert _sched_policy(threading.get_native_id()) == os.SCHED_OTHER  # training's thread is untouched
    assert read_commit(step_dir(tmp_path / "checkpoints", 1)) is not None
