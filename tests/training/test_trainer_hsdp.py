"""HSDP (2 replicas x 2 ranks per shard group, 4 real processes on gloo): faults restore from a live replica
of the shard and the run ends bitwise equal on disk to a fault-free HSDP run; its checkpoints hold each
shard once and resume on another replicate degree (1 x 2 and 2 x 1).

One faulted run through the rendered manifests and the local runner: 2 pods x 2 ranks (each pod one
replica) and a hot spare, `make train-job`'s HSDP job (in-process restart, so `--rank-restart in-place`):
- step 2: rank 2 raises at the top of its report (test hook, training/resilience/faults.py): its update is
  complete, so every rank is clean at step 2, which no rank had reported;
- step 3: rank 1 is SIGKILLed (a real crash): its shim starts it again alone, it rejoins the in-process
  restart of the others and receives its shard from its replica, rank 3; the launchers restart nothing;
- step 4: pod 1 is lost (every process SIGKILLed): the spare takes its place in the running round and its
  workers receive pod 1's shards from pod 0's ranks; the Job recreates pod 1, which waits as the new spare;
- step 5: rank 3 (now on the spare) raises inside its update (torn): rank 1 completed step 5 and sends it;
- step 7: pod 0 is lost (rank 0: in this mode the workers' stores live in the rendezvous' own store pod,
  so rank 0 is a rank like any other): the recreated pod 1, now the spare, takes its place and receives
  pod 0's shards from the other replica.
The fallback when no replica of a shard survives is the agreement's (tests/training/test_parallel_layout.py).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_helpers import REPO, TINY, assert_same_final_checkpoint, run_trainer, trainer_env

from fsdpkit.analysis.batch_ledger import compare_ledgers, step_batches
from fsdpkit.contracts.shapes import MODEL_CONFIGS
from fsdpkit.resilience.checkpoint.compare import final_checkpoint
from fsdpkit.runtime.events import read_events

pytestmark = pytest.mark.slow

STEPS = 8
HSDP = ["--parallel.replicate", "2"]
"""On 4 ranks: 2 replicas x 2 ranks per shard group (rank = replica x 2 + shard index)."""
FAULTS = "kill:step=3:rank=1,node:step=4:node=1,node:step=7:node=0"
HOOKS = {
    "KIT_FAULT_TEST_BEFORE_REPORT": "exception:step=2:rank=2",
    "KIT_FAULT_TEST_IN_UPDATE": "exception:step=5:rank=3",
}


def _args(root: Path, run_id: str, *extra: str) -> list[str]:
    return [
        "--run.id", run_id, "--run.root", str(root), *TINY, "--training.steps", str(STEPS),
        "--checkpoint.interval", "3", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def hsdp_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fault-free HSDP run (saves at steps 3, 6 and 8); its run folder."""
    tmp = tmp_path_factory.mktemp("hsdp-ref")
    run_trainer(tmp, _args(tmp / "runs", "ref", *HSDP), nproc=4).check()
    return tmp / "runs" / "ref"


def _local_job(tmp: Path, run_id: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    values = [
        "PROFILE=local", "NODES=2", "PROCS_PER_NODE=2", "SPARES=1", "MODEL=tiny", "SEQ_LEN=64",
        "BATCH_SIZE=2", f"STEPS={STEPS}", "CHECKPOINT_INTERVAL=3", "MONITOR_INTERVAL_S=0.1", "INPROCESS=true",
        "INPROCESS_MAX_RESTARTS=8",
        "TRAIN.optim.warmup_steps=3", "TRAIN.parallel.replicate=2", f"FAULT_SPEC={FAULTS}",
        *(f"ENV.{k}={v}" for k, v in HOOKS.items()), f"RUN_ID={run_id}",
    ]  # fmt: skip
    cmd = [sys.executable, "-m", "fsdpkit.k8s", "local", *values, "--workdir", str(tmp), "--timeout", "240"]
    proc = subprocess.run(cmd, cwd=REPO, env=trainer_env(tmp), capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return proc, tmp / run_id / "volumes" / "kit-local-runs" / "runs" / run_id


def test_crashes_lost_nodes_and_torn_steps_restore_from_live_replicas_bitwise(
    tmp_path: Path, hsdp_reference: Path
) -> None:
    proc, run_dir = _local_job(tmp_path, "hsdp-faults")
    assert "rank 1's worker died of signal 9; starting it again in place (1/3)" in proc.stdout + proc.stderr
    trainer = [e for e in read_events(run_dir) if e.get("role") == "trainer"]
    resumes = [e for e in trainer if e["kind"] == "resume" and e.get("step") is not None]
    from_live = [e for e in resumes if e["source"] in ("live", "replica")]
    found = sorted((e["step"], e["rank"], e["source"], e.get("sender")) for e in from_live)
    live = [(r, "live", None) for r in range(4)]
    assert found == sorted(
        [(2, *x) for x in live]  # the report failed: the step is complete on every rank
        + [(2, 0, "live", None), (2, 1, "replica", 3), (2, 2, "live", None), (2, 3, "live", None)]  # crash
        + [(3, 0, "live", None), (3, 1, "live", None), (3, 2, "replica", 0), (3, 3, "replica", 1)]  # pod 1
        + [(5, 0, "live", None), (5, 1, "live", None), (5, 2, "live", None), (5, 3, "replica", 1)]  # torn
        + [(6, 0, "replica", 2), (6, 1, "replica", 3), (6, 2, "live", None), (6, 3, "live", None)]  # pod 0
    ), found
    assert all(e["shared_bytes"] == 0 and e["bytes"] > 0 for e in from_live if e["source"] == "replica")
    assert len(from_live) == len(resumes), "no restore from the tiers or shared storage"
    launchers = [e for e in read_events(run_dir) if e.get("role") == "launcher" and e["kind"] == "restart"]
    assert not launchers, "no launcher restarted its workers: every fault was recovered in place"
    completed = sorted((e["rank"], e["step"]) for e in trainer if e.get("completed_by") == "restore")
    assert completed == sorted((r, s) for r in range(4) for s in (2, 5)), "their reports failed everywhere"
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
        resumed = [e for e in events if e["kind"] == "resume" and e.get("step") == 6]
        assert resumed and all(e["source"] == "shared" for e in resumed), resumed
        ledger = compare_ledgers(step_batches(root / "ref"), reference)
        assert ledger.exactly_once and ledger.global_batch_kept and ledger.same_batches, ledger.summary()
        assert ledger.max_loss_rel_diff < 0.02, (name, ledger.max_loss_rel_diff)
