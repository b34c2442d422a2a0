"""A user's own script, model and data through the rendered Job and the local runner (real processes, gloo).

`examples/hf_llama/train.py` (only the public resilience API) trains the 2-layer HF Llama of
tests/fixtures/hf on the repo's corpus, tokenized here with a BPE trained here
(`fsdpkit.data.prepare_data`), on 2 pods x 1 rank under the kit launcher, run by ENTRYPOINT. Against one
fault-free run:
- a kill, an exception and a hang on rank 1 (the demo's three faults), in-process restart on, run as a user
  runs it: the kit's wheel installed in a fresh venv (tests/wheel_env.py), its `kit-job local` started in a
  project folder outside the checkout that holds a copy of the example and a `training` package of its own;
- a drain of pod 1 with a hot spare (it leaves after the agreed step is committed: no step lost).
Each ends with its final checkpoint, verified and loaded back from disk, bitwise equal to the fault-free
run's, and with every sample of the final trajectory used exactly once, the fault-free run's samples; the
fault-free run's loss falls on the real text.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from wheel_env import user_env

from bench.own_model import exactly_once, trajectory
from fsdpkit.analysis import metrics
from fsdpkit.data import prepare_data
from fsdpkit.resilience.checkpoint.compare import compare_checkpoints, final_checkpoint
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


def user_project(folder: Path) -> Path:
    """A user's project: the example's folder copied as it is now, and a `training` package of its own."""
    shutil.copytree(REPO / "examples" / "hf_llama", folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "training").mkdir()
    (folder / "training" / "__init__.py").write_text("# the user's own package of this name\n")
    return folder


def run_job(
    tmp: Path, run_id: str, shards: Path, *overrides: str, venv: Path | None = None
) -> tuple[subprocess.CompletedProcess, Path]:
    """The example through the local runner, from the checkout with the project's venv; with `venv` (the
    installed wheel's), by that venv's `kit-job local` in a user's project folder (`user_project`)."""
    kit_job, cwd, env = [sys.executable, "-m", "fsdpkit.k8s"], REPO, {**os.environ, "PYTHONPATH": str(REPO)}
    script = "examples/hf_llama/train.py"
    if venv is not None:
        kit_job, cwd, env = [str(venv / "bin" / "kit-job")], user_project(tmp / "project"), user_env(venv)
        script = "train.py"
    entry = (f"python {script} --model-dir {TINY} --data-dir {shards} --seq-len 64 "
             "--sample-log $(RUN_DIR)/samples")  # fmt: skip
    proc = subprocess.run(
        [*kit_job, "local", *JOB, *overrides, f"ENTRYPOINT={entry}", f"RUN_ID={run_id}",
         "--workdir", str(tmp / "work"), "--timeout", "300"],
        cwd=cwd, env={**env, "COLUMNS": "200"}, capture_output=True, text=True, timeout=360,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return proc, tmp / "work" / run_id / "volumes" / "kit-local-runs" / "runs" / run_id


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


@pytest.mark.timeout(900)  # the session's fresh venv (tests/wheel_env.py) may be installed first
def test_the_users_script_run_by_the_installed_wheel_survives_kill_exception_and_hang_bitwise(
    tmp_path: Path, shards: Path, fault_free: Path, wheel_venv: Path
) -> None:
    """The fault-free reference ran from the checkout; here the kit is the wheel's (its local runner,
    launcher and resilience API) and the script a copy outside the checkout."""
    proc, run_dir = run_job(tmp_path, "hf-faults", shards, f"FAULT_SPEC={FAULTS}", venv=wheel_venv)
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
