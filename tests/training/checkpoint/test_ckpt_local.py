"""Single-process checkpoint behaviour: commit records, verification, fallback, retention, memory copy.

Real files, a real model and optimizer, no mocks; world size 1 (the 2-rank cases are in test_ckpt_dist).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch
from ckpt_worker import App, local_tensors

from training.checkpoint import CheckpointConfig, Checkpointer, CheckpointError
from training.checkpoint.commit import read_commit, verify_file
from training.checkpoint.layout import list_steps, step_dir
from training.checkpoint.retention import plan_deletions
from training.events import EventLog, read_events


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
    assert "crc32" in verify_file(folder, "__0_0.distcp", entry, checksum=True)
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
    with caplog.at_level(logging.WARNING, logger="training.checkpoint"):
        step, app = _resume(tmp_path)
    assert (step, app.step) == (2, 2)
    assert "step_00000003 skipped: damaged (__0_0.distcp: crc32" in caplog.text
    resumes = [e for e in read_events(tmp_path) if e["kind"] == "resume"]
    assert (resumes[-1]["step"], resumes[-1]["fallback_from"], resumes[-1]["source"]) == (2, 3, "disk")


def test_uncommitted_newest_is_ignored(tmp_path: Path) -> None:
    _train(tmp_path, steps=3)
    (step_dir(tmp_path / "checkpoints", 3) / "commit.json").unlink()
    step, _ = _resume(tmp_path)
    assert step == 2
    resumes = [e for e in read_events(tmp_path) if e["kind"] == "resume"]
    assert resumes[-1]["fallback_from"] is None


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
