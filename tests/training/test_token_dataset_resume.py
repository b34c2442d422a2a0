"""resilience.TokenDataset on real processes (gloo, torchrun): a user's script (token_dataset_job.py) on 2
ranks through an in-process restart that recomputes steps, stopped at step 8, then resumed resharded on 3
ranks to the end. The kept computation of every step read exactly its global batch (the global samples
[12 (s - 1), 12 s)), every sample once over the run and the right tokens for each; a recomputed step read
the same samples as the first time."""

from __future__ import annotations

import json
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from token_dataset_job import MICRO_BATCH, SEQ_LEN, VOCAB
from trainer_helpers import REPO, trainer_env

from fsdpkit import resilience
from fsdpkit.contracts.ports import free_port_run
from fsdpkit.data.make_shards import make_shards
from fsdpkit.runtime.events import read_events
from tests.fixtures.tokenizers import corpus_files

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
STEPS = 12
GLOBAL_BATCH = 12
"""2 ranks x 3 micro-batches x 2 samples, then 3 ranks x 2 x 2."""


def run_job(tmp: Path, nproc: int, data: Path, log: Path, args: list[str], env: dict[str, str]) -> None:
    """token_dataset_job.py on `nproc` ranks under torchrun (no restarts of its own)."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port_run()}", "--max-restarts", "0",
        "--log-dir", str(tmp / f"torchelastic-{nproc}"),
        str(REPO / "tests" / "training" / "token_dataset_job.py"), str(data), str(log), *args,
    ]  # fmt: skip
    done = subprocess.run(
        cmd, cwd=REPO, env=trainer_env(tmp) | env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def computations(log: Path) -> dict[int, list[dict]]:
    """Step -> every computation of it, all ranks', in the order written (a recomputed step twice)."""
    out: dict[int, list[dict]] = {}
    for path in sorted(log.parent.glob(log.name + ".rank*")):
        rank = int(path.name.rsplit("rank", 1)[1])
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line) | {"rank": rank}
            out.setdefault(record["step"], []).append(record)
    return out


def test_every_sample_once_across_an_inprocess_restart_and_a_resharded_resume(tmp_path: Path) -> None:
    data = tmp_path / "shards"
    text = tmp_path / "doc.txt"
    text.write_bytes(corpus_files()[0].read_bytes()[:1000])  # 58 samples an epoch: the run reads 2.5
    make_shards([text], data, shard_tokens=500)
    root, log = tmp_path / "runs", tmp_path / "samples"
    common = ["--run.id", "ds", "--run.root", str(root), "--training.steps", str(STEPS),
              "--training.global_batch", str(GLOBAL_BATCH), "--checkpoint.mode", "async",
              "--checkpoint.interval", "4", "--inprocess.enabled", "true",
              "--inprocess.barrier_timeout_s", "60"]  # fmt: skip
    torn = {"KIT_FAULT_TEST_IN_UPDATE": "exception:step=6:rank=1"}  # torn: back to the save of step 4
    run_job(tmp_path, 2, data, log, [*common, "--training.stop_at", "8"], torn)
    run_job(tmp_path, 3, data, log, common, {})

    steps = computations(log)
    assert sorted(steps) == list(range(1, STEPS + 1))
    recomputed = {s for s, runs in steps.items() if len(runs) > len({r["rank"] for r in runs})}
    assert recomputed == {5}, recomputed  # computed again after the restart; 6 failed before its log line
    cfg = resilience.load_config(
        ["--run.id", "x", "--checkpoint.mode", "off", "--training.global_batch", "12"]
    )
    plan = resilience.plan_batch(cfg, micro_batch=MICRO_BATCH, world_size=1)
    reference = resilience.TokenDataset(data, seq_len=SEQ_LEN, plan=plan, rank=0, seed=0, vocab_size=VOCAB)
    kept: list[int] = []
    for step, runs in sorted(steps.items()):
        last = {r["rank"]: r for r in runs}  # the kept computation: each rank's last
        assert {r["world"] for r in last.values()} == {2 if step <= 8 else 3}, step
        for rank, record in last.items():
            assert all(r["ids"] == record["ids"] for r in runs if r["rank"] == rank), (
                f"step {step} read again"
            )
            tokens = [zlib.crc32(reference.sample(i).numpy().tobytes()) for i in record["ids"]]
            assert record["crc"] == tokens, (step, rank)
        ids = sorted(i for r in last.values() for i in r["ids"])
        assert ids == list(range(GLOBAL_BATCH * (step - 1), GLOBAL_BATCH * step)), step
        kept += ids
    assert len(kept) == len(set(kept)) == STEPS * GLOBAL_BATCH > 2 * reference.samples_per_epoch  # 3 epochs
    resharded = {
        (e["from_world"], e["to_world"]) for e in read_events(root / "ds") if e["kind"] == "resharded"
    }
    assert resharded == {(2, 3)}
