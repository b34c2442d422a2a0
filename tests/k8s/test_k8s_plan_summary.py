"""`make train-job`'s plan line and warnings: a job left at the kit's defaults draws none; a user's fixed
checkpoint interval that costs goodput against the plan's does."""

from __future__ import annotations

import pytest

from fsdpkit.k8s.plan_summary import plan_lines
from fsdpkit.k8s.render import render
from fsdpkit.k8s.values import build_values


def _lines(*overrides: str) -> tuple[str | None, list[str]]:
    values = build_values(overrides=["RUN_ID=t", *overrides], allow_placeholders=True)
    (data,) = [m.obj["data"] for m in render(values) if m.obj.get("kind") == "ConfigMap"]
    return plan_lines(values, data["train.yaml"])


@pytest.mark.parametrize(
    "overrides", [[], ["NODES=8"], ["CHECKPOINT_INTERVAL=auto"]], ids=["default", "nodes-8", "auto"]
)
def test_the_defaults_draw_no_interval_warning(overrides: list[str]) -> None:
    """The p5 job's default interval is the one the plan would pick (auto): the plan never argues with it."""
    summary, warnings = _lines(*overrides)
    assert summary is not None and summary.startswith("plan: expected strict goodput ")
    assert not [w for w in warnings if w.startswith("CHECKPOINT_INTERVAL=")], warnings


def test_a_users_fixed_interval_that_costs_goodput_warns() -> None:
    _, warnings = _lines("CHECKPOINT_INTERVAL=100")
    (note,) = [w for w in warnings if w.startswith("CHECKPOINT_INTERVAL=")]
    assert note.startswith("CHECKPOINT_INTERVAL=100: expected goodput ")
    assert "use CHECKPOINT_INTERVAL=auto (Young/Daly from the measured save cost at run time)" in note


def test_checkpoints_off_gets_its_own_line_and_no_interval() -> None:
    summary, warnings = _lines("CHECKPOINT_MODE=off")
    assert summary == (
        "plan: checkpoint mode off: every fault that loses a node restarts from step 0 (make plan)"
    )
    assert warnings == []


def test_the_line_plans_the_jobs_own_layout() -> None:
    """The plan's step is the job's layout's: 1-D FSDP unless TRAIN.parallel.replicate says HSDP."""
    fsdp, _ = _lines("NODES=4")
    hsdp, _ = _lines("NODES=4", "TRAIN.parallel.replicate=4")
    assert fsdp is not None and "communication of 1-D FSDP over 32 GPUs" in fsdp
    assert hsdp is not None and "communication of HSDP 4 x 8" in hsdp
