"""The demo's verdict comes from the persisted final checkpoints: a run that ends elsewhere fails it."""

from __future__ import annotations

from pathlib import Path

import torch

from demo.run import (
    FAULT_FREE,
    KIT,
    KIT_NODE,
    SYNC,
    TORCHRUN_NODE,
    Outcome,
    compare_with_reference,
    ended_launchers,
    guarantee_holds,
    torchrun_node_loss_line,
    whole_job_restart,
)
from fsdpkit.analysis.metrics import FaultMetrics
from fsdpkit.k8s.local import PodRecord
from fsdpkit.resilience.checkpoint.checkpointer import Checkpointer
from fsdpkit.resilience.checkpoint.config import CheckpointConfig


def _run(run_dir: Path, weights: torch.Tensor, *, step: int = 3) -> Path:
    ckpt = Checkpointer(CheckpointConfig(mode="sync", interval=1), run_dir=run_dir, rank=0, world_size=1)
    ckpt.maybe_save(step, {"w": weights.clone()})
    ckpt.close()
    return run_dir


def _outcome(variant, run_dir: Path, *, succeeded: bool = True) -> Outcome:
    return Outcome(variant=variant, succeeded=succeeded, reason="", wall_s=0.0, run_dir=run_dir)


def test_a_kit_run_that_ends_with_another_checkpoint_fails_the_demo(tmp_path: Path) -> None:
    w = torch.arange(6, dtype=torch.float32)
    ref = _outcome(FAULT_FREE, _run(tmp_path / "ref", w))
    same = _outcome(KIT, _run(tmp_path / "kit", w))
    compare_with_reference(same, ref)
    assert same.same_final_as == {"reference": True} and guarantee_holds([same, ref], ref)

    nudged = w.clone()
    nudged[2] = torch.nextafter(nudged[2], torch.tensor(10.0))  # one bit in one value
    differs = _outcome(KIT, _run(tmp_path / "kit-differs", nudged))
    compare_with_reference(differs, ref)
    assert differs.same_final_as == {"reference": False} and "1 of 1 values differ" in differs.compare_note
    assert not guarantee_holds([differs, ref], ref)


def test_a_missing_or_earlier_final_checkpoint_fails_the_demo(tmp_path: Path) -> None:
    w = torch.ones(4)
    ref = _outcome(FAULT_FREE, _run(tmp_path / "ref", w))
    earlier = _outcome(SYNC, _run(tmp_path / "sync", w, step=2))
    missing = _outcome(KIT, tmp_path / "nothing", succeeded=False)
    for o in (earlier, missing):
        compare_with_reference(o, ref)
        assert o.same_final_as == {"reference": False}
    assert "final checkpoint is step_00000002, the reference's step_00000003" in earlier.compare_note
    assert "no committed checkpoint" in missing.compare_note
    assert not guarantee_holds([missing, ref], ref)


def test_a_baseline_that_ends_elsewhere_is_shown_but_the_verdict_is_the_kits(tmp_path: Path) -> None:
    w = torch.arange(4, dtype=torch.float32)
    ref = _outcome(FAULT_FREE, _run(tmp_path / "ref", w))
    kit = _outcome(KIT, _run(tmp_path / "kit", w))
    base = _outcome(TORCHRUN_NODE, _run(tmp_path / "torchrun", w + 1))
    for o in (kit, base):
        compare_with_reference(o, ref)
    assert base.same_final_as == {"reference": False}
    assert guarantee_holds([kit, base, ref], ref)
    kit_node = _outcome(KIT_NODE, tmp_path / "kit-node-nothing", succeeded=False)
    compare_with_reference(kit_node, ref)
    assert not guarantee_holds([kit, kit_node, ref], ref)  # every kit run must finish, node loss included


def _pods(*codes: tuple[int, int, int | None]) -> list[PodRecord]:
    """(index, attempt, exit code) -> the records the local runner keeps."""
    return [
        PodRecord(
            name=f"demo-{i}-local" + (f"-r{a}" if a else ""), index=i, attempt=a, log=Path("x"), exit_code=c
        )
        for i, a, c in codes
    ]


def _node_fault(recovery_s: float | None) -> FaultMetrics:
    return FaultMetrics(kind="node", step=14, rank=None, ts=0.0, detect_s=None, recovery_s=recovery_s, node=0)


def test_torchrun_losing_pod_0_is_said_to_survive_only_as_a_new_job(tmp_path: Path) -> None:
    """Every launcher ended and the Job recreated every pod: a whole-job restart, not a recovery."""
    base = _outcome(TORCHRUN_NODE, tmp_path)
    base.pods = _pods((0, 0, -9), (1, 0, 1), (0, 1, 0), (1, 1, 0))
    assert whole_job_restart(base.pods)
    line = torchrun_node_loss_line(base, _node_fault(33.0))
    assert "2 of 2 launchers ended;" in line
    assert "only as a whole-job restart (the Job recreated every pod)" in line
    assert "training again after 33.0 s" in line and "the study: 270 s" in line
    assert "differs" not in line
    base.same_final_as = {"reference": False}
    assert "docs/runbook.md 'torchrun after losing pod 0'" in torchrun_node_loss_line(base, _node_fault(33.0))


def test_torchrun_that_was_not_restarted_whole_lost_the_job(tmp_path: Path) -> None:
    base = _outcome(TORCHRUN_NODE, tmp_path, succeeded=False)
    base.reason = "index 1 failed 1 times"
    base.pods = _pods((0, 0, -9), (1, 0, 1), (0, 1, None))
    assert not whole_job_restart(base.pods)  # index 1 never came back
    line = torchrun_node_loss_line(base, _node_fault(None))
    assert line.endswith("; the job was lost (index 1 failed 1 times)")
    survivor = _pods((0, 0, -9), (1, 0, 0), (0, 1, 0))  # a launcher that lived on: no whole-job restart
    assert not whole_job_restart(survivor) and [p.index for p in ended_launchers(survivor)] == [0]
