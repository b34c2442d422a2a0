"""HSDP (2 replicas x 2 ranks per shard group, 4 real processes on gloo): faults inside a step restore from a
live replica of the shard and the run ends bitwise equal on disk to a fault-free HSDP run; its checkpoints
hold each shard once and resume on another replicate degree (1 x 2 and 2 x 1).

Faults (test hooks, training/resilience/faults.py): rank 2 raises at the top of step 2's report (its update
complete: every rank is clean at step 2, which no rank had reported), rank 1 raises inside step 4's update
(torn: its replica, rank 3, completed step 4 and sends it).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from trainer_helpers import TINY, assert_same_final_checkpoint, run_trainer

from fsdpkit.analysis.batch_ledger import compare_ledgers, step_batches
from fsdpkit.contracts.shapes import MODEL_CONFIGS
from fsdpkit.resilience.checkpoint.compare import final_checkpoint
from fsdpkit.runtime.events import read_events

pytestmark = pytest.mark.slow

STEPS = 6
HSDP = ["--parallel.replicate", "2"]
"""On 4 ranks of one node: 2 replicas x 2 ranks per shard group (rank = replica x 2 + shard index)."""


def _args(root: Path, run_id: str, *extra: str) -> list[str]:
    return [
        "--run.id", run_id, "--run.root", str(root), *TINY, "--training.steps", str(STEPS),
        "--checkpoint.interval", "3", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def hsdp_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fault-free HSDP run (saves at steps 3 and 6); its run folder."""
    tmp = tmp_path_factory.mktemp("hsdp-ref")
    run_trainer(tmp, _args(tmp / "runs", "ref", *HSDP), nproc=4).check()
    return tmp / "runs" / "ref"


def test_faults_inside_a_step_restore_from_a_live_replica_bitwise(
    tmp_path: Path, hsdp_reference: Path
) -> None:
    args = _args(tmp_path / "runs", "faulted", *HSDP, "--inprocess.enabled", "true")
    env = {
        "KIT_FAULT_TEST_BEFORE_REPORT": "exception:step=2:rank=2",
        "KIT_FAULT_TEST_IN_UPDATE": "exception:step=4:rank=1",
    }
    run_trainer(tmp_path, args, nproc=4, env=env).check()
    run_dir = tmp_path / "runs" / "faulted"
    events = read_events(run_dir)
    restarts = [e for e in events if e["kind"] == "inprocess_restart"]
    assert sorted((e["rank"], e["restored_step"]) for e in restarts) == sorted(
        [(r, 2) for r in range(4)] + [(r, 4) for r in range(4)]
    ), "both faults: every rank agrees on the step"
    resumes = {(e["rank"], e["step"]): e for e in events if e["kind"] == "resume" and e["step"] in (2, 4)}
    assert {k: e["source"] for k, e in resumes.items()} == {
        **{(r, 2): "live" for r in range(4)},  # the step whose report failed is complete everywhere
        **{(r, 4): "live" for r in (0, 2, 3)},
        (1, 4): "replica",
    }
    received = resumes[(1, 4)]
    assert received["sender"] == 3 and received["shared_bytes"] == 0, received
    assert received["bytes"] == resumes[(3, 4)]["sent_bytes"] > 0
    torn = next(e for e in restarts if e["restored_step"] == 4)
    assert "rank 1: failed mid-update of step 4" in torn["why"], torn
    for rank in range(4):  # nothing computed again: every step once, in one process
        steps = [e for e in events if e["kind"] == "step" and e["rank"] == rank]
        assert [e["step"] for e in steps] == list(range(1, STEPS + 1)), rank
        assert len({e["pid"] for e in steps}) == 1
    completed = [e for e in events if e["kind"] == "step" and e.get("completed_by") == "restore"]
    assert sorted((e["rank"], e["step"]) for e in completed) == sorted(
        [(r, 2) for r in range(4)] + [(r, 4) for r in range(4)]
    ), "both steps' reports failed on every rank; their events come after the restore"
    ledger = compare_ledgers(step_batches(run_dir), step_batches(hsdp_reference))
    assert ledger.exactly_once and ledger.same_batches, ledger.summary()
    assert_same_final_checkpoint(run_dir, hsdp_reference, step=STEPS)


def test_an_hsdp_checkpoint_holds_each_shard_once_and_resumes_on_another_replicate_degree(
    tmp_path: Path, hsdp_reference: Path
) -> None:
    final = final_checkpoint(hsdp_reference)
    written = sum(p.stat().st_size for p in final.glob("*.distcp"))
    state = 12 * MODEL_CONFIGS["tiny"].num_params()  # fp32 weights + two AdamW moments, once
    assert state <= written < 1.3 * state, f"{written} bytes written for {state} bytes of state"
    reference = step_batches(hsdp_reference)
    for name, layout in (("1x2", ["--parallel.replicate", "1"]), ("2x1", ["--parallel.replicate", "2"])):
        root = tmp_path / name
        shutil.copytree(hsdp_reference, root / "ref")
        shutil.rmtree(root / "ref" / "checkpoints" / final.name)
        run_trainer(tmp_path, _args(root, "ref", *layout), nproc=2).check()
        events = read_events(root / "ref")
        resumed = [e for e in events if e["kind"] == "resume" and e.get("step") == 3]
        assert resumed and all(e["source"] == "shared" for e in resumed), resumed
        ledger = compare_ledgers(step_batches(root / "ref"), reference)
        assert ledger.exactly_once and ledger.global_batch_kept and ledger.same_batches, ledger.summary()
        assert ledger.max_loss_rel_diff < 0.02, (name, ledger.max_loss_rel_diff)
