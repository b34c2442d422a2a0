"""HSDP (2 replicas x 2 ranks per shard group, 4 real processes on gloo): faults restore from a live replica
of the shard and the run ends bitwise equal on disk to a fault-free HSDP run; its checkpoints hold each
shard once and resume on another replicate degree (1 x 2 and 2 x 1).

One faulted run under the kit launcher with `--rank-restart in-place`, three faults:
- step 2: rank 2 raises at the top of its report (test hook, training/resilience/faults.py): its update is
  complete, so every rank is clean at step 2, which no rank had reported;
- step 3: rank 1 is SIGKILLed (a real crash): its shim starts it again alone, it rejoins the in-process
  restart of the others and receives its shard from its replica, rank 3; the launcher restarts nothing;
- step 5: rank 3 raises inside its update (torn): its replica, rank 1, the process started again at step 3,
  completed step 5 and sends it.
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


def test_a_crash_and_faults_inside_steps_restore_from_a_live_replica_bitwise(
    tmp_path: Path, hsdp_reference: Path
) -> None:
    run_dir = tmp_path / "runs" / "faulted"
    crash = ["--fault.spec", "kill:step=3:rank=1"]
    args = _args(tmp_path / "runs", "faulted", *HSDP, "--inprocess.enabled", "true", *crash)
    cmd = [
        sys.executable, "-m", "fsdpkit.launcher", "--standalone", "--nproc-per-node", "4", "--rank-restart",
        "in-place", "--log-dir", str(tmp_path / "logs"), "--run-dir", str(run_dir), "-m", "fsdpkit.trainer",
        *args,
    ]  # fmt: skip
    env = {
        **trainer_env(tmp_path),
        "KIT_FAULT_TEST_BEFORE_REPORT": "exception:step=2:rank=2",
        "KIT_FAULT_TEST_IN_UPDATE": "exception:step=5:rank=3",
    }
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "workers finished after 0 restart(s)" in proc.stderr, "the crash restarted no worker group"
    assert "rank 1's worker died of signal 9; starting it again in place (1/3)" in proc.stderr
    events = read_events(run_dir)
    trainer = [e for e in events if e.get("role") == "trainer"]
    restarts = [e for e in trainer if e["kind"] == "inprocess_restart"]
    assert sorted((e["rank"], e["restored_step"]) for e in restarts) == sorted(
        (r, s) for r in range(4) for s in (2, 2, 5)
    ), "three faults: every rank agrees on the step each time (the crash: step 2 again, nothing done since)"
    resumes = [e for e in trainer if e["kind"] == "resume" and e.get("step") is not None]
    by_source = sorted((e["rank"], e["step"], e["source"]) for e in resumes)
    assert by_source == sorted(
        [(r, 2, "live") for r in range(4)]  # the step whose report failed is complete everywhere
        + [(0, 2, "live"), (1, 2, "replica"), (2, 2, "live"), (3, 2, "live")]  # the crash
        + [(0, 5, "live"), (1, 5, "live"), (2, 5, "live"), (3, 5, "replica")]  # torn inside the update
    ), by_source
    received = [e for e in resumes if e["source"] == "replica"]
    assert [(e["rank"], e["sender"], e["shared_bytes"]) for e in received] == [(1, 3, 0), (3, 1, 0)]
    sent = {e["rank"]: e.get("sent_bytes") for e in resumes if e.get("sent_bytes")}
    assert sorted(sent) == [1, 3] and all(e["bytes"] == sent[e["sender"]] > 0 for e in received)
    for rank in (0, 2):  # the survivors computed every step once, in one process
        steps = [e for e in trainer if e["kind"] == "step" and e["rank"] == rank]
        assert [e["step"] for e in steps] == list(range(1, STEPS + 1)), rank
        assert len({e["pid"] for e in steps}) == 1
    completed = [e for e in trainer if e["kind"] == "step" and e.get("completed_by") == "restore"]
    assert sorted((e["rank"], e["step"]) for e in completed) == sorted(
        [(r, 2) for r in range(4)] + [(r, 5) for r in range(4)]
    ), "the steps whose reports failed on every rank get their events after the restore"
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
