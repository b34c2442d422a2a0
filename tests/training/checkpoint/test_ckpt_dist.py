"""Two ranks, real processes, gloo, FSDP2: the checkpoint guarantees under load and under faults.

- sync, async (kit) and async (dcp) checkpoints of the same steps hold identical tensors, readable by
  plain DCP (converted with dcp_to_torch_save);
- no torn checkpoint: with a slowed writer, every committed step equals the live state at that step;
- SIGKILL of a rank while its shard is written: the next start resumes from the previous commit and
  ends bitwise equal to an uninterrupted run;
- one truncated shard of the newest step: resume falls back to the one before, and says so;
- a failed save (writes refused by the OS) is counted and training goes on.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from ckpt_helpers import finish, run, start
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from fsdpkit.runtime.events import read_events

pytestmark = pytest.mark.slow
STEPS = 6


def _flat(obj: object, path: str = "") -> dict[str, object]:
    if isinstance(obj, dict):
        out: dict[str, object] = {}
        for k, v in obj.items():
            out.update(_flat(v, f"{path}/{k}"))
        return out
    if isinstance(obj, (list, tuple)):
        out = {}
        for i, v in enumerate(obj):
            out.update(_flat(v, f"{path}/{i}"))
        return out
    return {path: obj}


def _as_single_file(folder: Path, tmp: Path) -> dict[str, object]:
    out = tmp / f"{folder.parent.parent.name}-{folder.name}.pt"
    dcp_to_torch_save(folder, out)
    return _flat(torch.load(out, weights_only=False))


def _same(a: dict[str, object], b: dict[str, object]) -> list[str]:
    assert a.keys() == b.keys()
    diff = []
    for k in a:
        x, y = a[k], b[k]
        equal = torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
        if not equal:
            diff.append(k)
    return diff


def _finals(run_dir: Path) -> list[dict[str, torch.Tensor]]:
    return [torch.load(run_dir / f"final_rank{r}.pt") for r in range(2)]


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("sync")
    run(run_dir, "--steps", str(STEPS), "--mode", "sync")
    return run_dir


def test_async_and_sync_checkpoints_hold_identical_tensors_and_none_is_torn(
    sync_run: Path, tmp_path: Path
) -> None:
    kit, dcp_async = tmp_path / "kit", tmp_path / "dcp"
    slow = {"KIT_CKPT_TEST_DELAY_S": "0.01"}  # writes overlap the next steps' optimizer updates
    run(kit, "--steps", str(STEPS), "--mode", "async", "--backend", "kit", "--verify-snapshots", env=slow)
    run(dcp_async, "--steps", str(STEPS), "--mode", "async", "--backend", "dcp", "--verify-snapshots")
    for run_dir in (kit, dcp_async):
        for rank in range(2):
            report = json.loads((run_dir / f"snapshots_rank{rank}.json").read_text())
            assert report == {"2": [], "4": [], "6": []}, f"{run_dir.name} rank {rank}: torn {report}"
    for step in (2, 4, 6):
        want = _as_single_file(sync_run / "checkpoints" / f"step_{step:08d}", tmp_path)
        for run_dir in (kit, dcp_async):
            got = _as_single_file(run_dir / "checkpoints" / f"step_{step:08d}", tmp_path)
            assert _same(want, got) == [], f"{run_dir.name} step {step} differs from sync"
    stalls = [e for e in read_events(kit) if e["kind"] == "ckpt" and e["phase"] == "stall"]
    assert {e["step"] for e in stalls} == {2, 4, 6}


def _wait_for(path: Path, procs: list, deadline_s: float = 90) -> None:
    deadline = time.monotonic() + deadline_s
    while not path.exists():
        if any(p.poll() is not None for p in procs):
            raise AssertionError(f"a worker exited before {path} appeared: {[p.returncode for p in procs]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {deadline_s}s")
        time.sleep(0.01)  # a deadline poll on a file, not a synchronisation sleep


def test_kill_while_writing_resumes_from_previous_commit_bitwise(sync_run: Path, tmp_path: Path) -> None:
    procs = start(tmp_path, "--steps", str(STEPS), "--mode", "async", env={"KIT_CKPT_TEST_DELAY_S": "0.05"})
    shard = tmp_path / "checkpoints" / "step_00000004" / "__1_0.distcp"
    _wait_for(shard, procs)
    os.kill(procs[1].pid, signal.SIGKILL)
    os.kill(procs[0].pid, signal.SIGKILL)  # the launcher tears the group down after a rank dies
    finish(procs)
    root = tmp_path / "checkpoints"
    assert (root / "step_00000002" / "commit.json").is_file()
    assert not (root / "step_00000004" / "commit.json").exists()

    results = run(tmp_path, "--steps", str(STEPS), "--mode", "async", "--resume")
    assert all("resumed_from 2" in out for _, out, _ in results)
    for want, got in zip(_finals(sync_run), _finals(tmp_path), strict=True):
        assert [k for k in want if not torch.equal(want[k], got[k])] == []
    assert (root / "step_00000006" / "commit.json").is_file()


def test_truncated_shard_of_latest_falls_back_and_says_so(sync_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(sync_run / "checkpoints", run_dir / "checkpoints")
    shard = run_dir / "checkpoints" / "step_00000006" / "__1_0.distcp"
    os.truncate(shard, shard.stat().st_size // 2)

    results = run(run_dir, "--steps", str(STEPS), "--mode", "sync", "--resume")
    assert all("resumed_from 4" in out for _, out, _ in results)
    skipped = [line for line in results[0][2].splitlines() if "step_00000006 skipped: damaged" in line]
    assert len(skipped) == 1 and "__1_0.distcp: size" in skipped[0]
    assert "skipped" not in results[1][2], "rank 0 names a skipped folder, once per job"
    resumes = [e for e in read_events(run_dir) if e["kind"] == "resume"]
    assert {(e["rank"], e["step"], e["fallback_from"]) for e in resumes} == {(0, 4, 6), (1, 4, 6)}
    for want, got in zip(_finals(sync_run), _finals(run_dir), strict=True):
        assert [k for k in want if not torch.equal(want[k], got[k])] == []


def test_failed_save_is_counted_and_training_goes_on(tmp_path: Path) -> None:
    # The OS refuses writes past 64 KiB per file (RLIMIT_FSIZE -> EFBIG): every shard write fails.
    results = run(tmp_path, "--steps", "4", "--mode", "async", "--fsize-limit", "65536")
    assert (
        "checkpoint of step 2 failed, training goes on: rank 0: OSError: [Errno 27] File too large"
        in (results[0][2])
    )
    events = read_events(tmp_path)
    failed = {e["step"] for e in events if e["kind"] == "ckpt" and e["phase"] == "failed"}
    assert failed == {2, 4}
    assert not [e for e in events if e["kind"] == "ckpt" and e["phase"] == "commit"]
    assert all(f"rank {r} finished step 4" in results[r][1] for r in range(2))
