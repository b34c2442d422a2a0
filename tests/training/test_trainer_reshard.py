"""A resume on another world size (resharded): 2 ranks, then 1, then 3 consume the same samples in the same
optimizer steps as a fixed 4-rank run, every sample once, with losses equal to fp32 rounding; a world size
that cannot keep the global batch, and a checkpoint from before resharding, are refused in one line.

Not marked slow although it trains on several processes: plain torchrun, no fault, no launcher, nothing
timed or learned from step times, so it runs beside the other tests (tools/run_tests.py) instead of in the
one-at-a-time group, whose length is the suite's."""

from __future__ import annotations

from pathlib import Path

from elastic_job import ELASTIC, ELASTIC_LOSS_RTOL
from trainer_helpers import TINY, run_cli, run_trainer

from fsdpkit.analysis.batch_ledger import compare_ledgers, step_batches
from fsdpkit.contracts import exitcodes
from fsdpkit.resilience.checkpoint.commit import CommitRecord, FileEntry, expected_files, write_commit
from fsdpkit.resilience.checkpoint.layout import checkpoints_dir, step_dir
from fsdpkit.runtime.events import read_events


def test_a_restart_on_other_world_sizes_reshards_and_keeps_every_global_batch(
    tmp_path: Path, elastic_reference: Path
) -> None:
    """2 ranks to step 4, then 1 rank to step 8, then 3 ranks to the end: the same samples in the same
    optimizer steps as a fixed 4-rank run, every sample once, the loss within ELASTIC_LOSS_RTOL."""
    root = tmp_path / "runs"
    common = ["--run.id", "resized", "--run.root", str(root), *ELASTIC, "--checkpoint.mode", "async",
              "--checkpoint.interval", "4"]  # fmt: skip
    outputs = [
        run_trainer(tmp_path, [*common, "--training.stop_at", str(stop)], nproc=nproc).check().stdout
        for nproc, stop in ((2, 4), (1, 8), (3, 0))
    ]
    assert "2 rank(s) x 6 micro-batch(es) x 1 samples" in outputs[0]
    assert "1 rank(s) x 12 micro-batch(es) x 1 samples" in outputs[1]
    assert "3 rank(s) x 4 micro-batch(es) x 1 samples" in outputs[2]
    events = read_events(root / "resized")
    resharded = [(e["step"], e["from_world"], e["to_world"]) for e in events if e["kind"] == "resharded"]
    assert sorted(set(resharded)) == [(4, 2, 1), (8, 1, 3)]
    assert len(resharded) == 1 + 3, "every rank of the new world reports it"
    ledger = compare_ledgers(step_batches(root / "resized"), step_batches(elastic_reference))
    assert ledger.exactly_once and ledger.same_batches and ledger.global_batch_kept, ledger.summary()
    assert ledger.worlds == [2, 1, 3]
    assert ledger.max_loss_rel_diff <= ELASTIC_LOSS_RTOL, ledger.max_loss_rel_diff


def test_a_world_size_that_cannot_keep_the_global_batch_is_refused_naming_those_that_can(
    tmp_path: Path,
) -> None:
    root = tmp_path / "runs"
    done = run_cli(tmp_path, ["--run.id", "odd", "--run.root", str(root), *ELASTIC], env={"WORLD_SIZE": "5"})
    assert done.returncode == exitcodes.FATAL_CONFIG
    (line,) = done.stderr.strip().splitlines()
    assert "the global batch 12 (training.global_batch) cannot be split exactly over 5 rank(s)" in line
    assert "run on 1, 2, 3, 4, 6, 12 rank(s)" in line
    assert not (root / "odd" / "events").exists(), "refused before anything ran"


def test_a_checkpoint_that_predates_resharding_is_refused_before_any_process_group(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    folder = step_dir(checkpoints_dir(root / "resized"), 4)
    folder.mkdir(parents=True)
    entry = FileEntry(size=0, crc32=0)
    files = {name: entry for name in expected_files(2)}
    write_commit(folder, CommitRecord(step=4, world_size=2, files=files))
    done = run_cli(tmp_path, ["--run.id", "resized", "--run.root", str(root), *TINY, "--training.steps", "8"])
    assert done.returncode == exitcodes.FATAL_CONFIG
    (line,) = done.stderr.strip().splitlines()
    assert "was written by 2 rank(s), this job has 1 and it predates resharded resume" in line
    assert "resume it on 2 rank(s)" in line
    assert not (root / "resized" / "events").exists(), "refused before anything ran"
