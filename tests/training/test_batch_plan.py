"""resilience.plan_batch: the global batch a job keeps, where it comes from, and the world sizes it refuses,
against real commit records in a run folder (before any process group, as the trainer calls it)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fsdpkit import resilience
from fsdpkit.resilience.checkpoint.commit import CommitRecord, FileEntry, expected_files, write_commit
from fsdpkit.resilience.checkpoint.layout import checkpoints_dir, step_dir


def _config(root: Path, *extra: str) -> resilience.ResilienceConfig:
    return resilience.load_config(["--run.id", "b", "--run.root", str(root), *extra])


def _commit(root: Path, step: int, world: int, global_batch: int | None) -> None:
    folder = step_dir(checkpoints_dir(root / "b"), step)
    folder.mkdir(parents=True)
    files = {name: FileEntry(size=0, crc32=0) for name in expected_files(world)}
    write_commit(folder, CommitRecord(step=step, world_size=world, files=files, global_batch=global_batch))


def test_a_fresh_job_declares_its_own_product_and_records_the_plan(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "--training.grad_accum_steps", "2")
    plan = resilience.plan_batch(cfg, micro_batch=4, world_size=3)
    assert (plan.global_batch, plan.accum) == (24, 2)
    planned = plan.config.training  # what checkpoints declare
    assert (planned.global_batch, planned.grad_accum_steps) == (24, 2)
    assert (cfg.training.global_batch, cfg.training.grad_accum_steps) == (0, 2)  # frozen, left as loaded
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.training.global_batch = 24  # type: ignore[misc]
    assert plan.line() == (
        "global batch 24 samples per optimizer step (data.batch_size x training.grad_accum_steps x world "
        "size): 3 rank(s) x 2 micro-batch(es) x 4 samples"
    )


def test_a_run_keeps_its_checkpoints_global_batch_through_every_restart_on_any_world_size(
    tmp_path: Path,
) -> None:
    """Trained on 4 ranks x 4 (16); on 2 ranks it keeps 16 (2 micro-batches each), and restarted again on 2
    (the newest record now a 2-rank one) still 16, not 2 x 4 = 8; the config's own product is shown."""
    _commit(tmp_path, 4, world=4, global_batch=16)
    plan = resilience.plan_batch(_config(tmp_path), micro_batch=4, world_size=2)
    assert (plan.global_batch, plan.accum) == (16, 2)
    _commit(tmp_path, 8, world=2, global_batch=16)
    again = resilience.plan_batch(_config(tmp_path), micro_batch=4, world_size=2)
    assert (again.global_batch, again.accum) == (16, 2)
    assert again.source == (
        "kept from the checkpoint of step 8; data.batch_size x grad_accum_steps x world size would be 8"
    )
    given = resilience.plan_batch(
        _config(tmp_path, "--training.global_batch", "8"), micro_batch=4, world_size=2
    )
    assert (given.global_batch, given.accum) == (8, 1)  # to change a run's batch, say so


def test_a_world_size_that_cannot_keep_a_checkpoints_batch_names_the_sizes_or_a_new_run(
    tmp_path: Path,
) -> None:
    _commit(tmp_path, 4, world=4, global_batch=16)
    with pytest.raises(resilience.ConfigError) as info:
        resilience.plan_batch(_config(tmp_path), micro_batch=4, world_size=3)
    (line,) = str(info.value).splitlines()
    assert line == (
        "the global batch 16 (kept from the checkpoint of step 4; data.batch_size x grad_accum_steps x world "
        "size would be 12) cannot be split exactly over 3 rank(s) of 4 samples: run on 1, 2, 4 rank(s), or "
        "use a new run.id"
    )
