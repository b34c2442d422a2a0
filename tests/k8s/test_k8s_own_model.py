"""A user's own script, model and data through the rendered Job and the local runner (real processes, gloo).

`examples/hf_llama/train.py` (only the public resilience API) trains the 2-layer HF Llama of
tests/fixtures/hf on the repo's corpus, tokenized here with a BPE trained here
(`fsdpkit.trainer.prepare_data`), on 2 pods x 1 rank under the kit launcher, run by ENTRYPOINT. Against one
fault-free run:
- a kill, an exception and a hang on rank 1 (the demo's three faults), in-process restart on;
- a drain of pod 1 with a hot spare (it leaves after the agreed step is committed: no step lost).
Each ends with its final checkpoint, verified and loaded back from disk, bitwise equal to the fault-free
run's, and with every sample of the final trajectory used exactly once, the fault-free run's samples; the
fault-free run's loss falls on the real text.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.own_model import exactly_once, trajectory
from fsdpkit.analysis import metrics
from fsdpkit.resilience.checkpoint.compare import compare_checkpoints, final_checkpoint
from fsdpkit.trainer import prepare_data
from tests.fixtures.tokenizers import corpus_files, train_bpe_tokenizer

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "fixtures" / "hf" / "tiny-llama"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
STEPS = 20
JOB = ["NODES=2", f"STEPS={STEPS}", "CHECKPOINT_INTERVAL=4", "INPROCESS=true", "MONITOR_INTERVAL_S=0.1"]
FAULTS = "kill:step=5:rank=1,exception:step=10:rank=1,hang:step=15:rank=1"


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    tokenizer = train_bpe_tokenizer(root / "tok", vocab_size=512)
    prepare_data.prepare(corpus_files(), root / "shards", tokenizer=tokenizer)
    return root / "shards"


def run_job(
    tmp: Path, run_id: str, shards: Path, *overrides: str
) -> tuple[subprocess.CompletedProcess, Path]:
    entry = (f"python examples/hf_llama/train.py --model-dir {TINY} --data-dir {shards} --seq-len 64 "
             "--sample-log $(RUN_DIR)/samples")  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "fsdpkit.k8s", "local", *JOB, *overrides, f"ENTRYPOINT={entry}",
         f"RUN_ID={run_id}",
         "--workdir", str(tmp), "--timeout", "300"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
        capture_output=True, text=True, timeout=360,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return proc, tmp / run_id / "volumes" / "kit-local-runs" / "runs" / run_id


def assert_same_run(run_dir: Path, reference: Path) -> None:
    result = compare_checkpoints(final_checkpoint(run_dir), final_checkpoint(reference))
    assert result.equal, result.summary()
    assert {"model", "optim", "data", "scheduler"} <= result.groups
    assert exactly_once(run_dir, reference, STEPS), trajectory(run_dir)


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory: pytest.TempPathFactory, shards: Path) -> Path:
    run_dir = run_job(tmp_path_factory.mktemp("ref"), "hf-ref", shards)[1]
    losses = [e["loss"] for e in metrics.load_events(run_dir) if e["kind"] == "step" and e["rank"] == 0]
    assert len(losses) == STEPS and losses[-1] < losses[0] - 0.3, losses  # it learns the real text
    return run_dir


def test_the_users_script_survives_kill_exception_and_hang_bitwise(
    tmp_path: Path, shards: Path, fault_free: Path
) -> None:
    proc, run_dir = run_job(tmp_path, "hf-faults", shards, f"FAULT_SPEC={FAULTS}")
    assert_same_run(run_dir, fault_free)
    m = metrics.load_run_metrics(run_dir)
    assert [(f.kind, f.step) for f in m.faults] == [("kill", 5), ("exception", 10), ("hang", 15)]
    assert m.faults_recovered == 3 and m.faults_unfired == [] and m.steps_completed == STEPS
    assert "local job completed" in proc.stdout


def test_the_users_script_drains_to_a_spare_losing_no_step(
    tmp_path: Path, shards: Path, fault_free: Path
) -> None:
    proc, run_dir = run_job(tmp_path, "hf-drain", shards, "SPARES=1", "FAULT_SPEC=drain:step=8:node=1")
    assert_same_run(run_dir, fault_free)
    m = metrics.load_run_metrics(run_dir)
    assert [(f.kind, f.step, f.lost_steps) for f in m.faults] == [("drain", 8, 0)]
    assert "pod hf-drain-1-local: exit code 143" in proc.stdout
