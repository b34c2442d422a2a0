"""`make train-job`'s one line from the plan (ops/plan): what the job it renders is expected to keep, and a
warning where its spares or its fixed checkpoint interval cost goodput against the plan's. A default never
warns: the planned profiles render CHECKPOINT_INTERVAL=auto unless the user fixes one (fsdpkit.k8s.derived).

The plan's figures are p5's (H100 peak, the study's restart times, cdk.json's FSx), so only p5 jobs of the
kit's own trainer get a line; a user's ENTRYPOINT has no kit model to size.
"""

from __future__ import annotations

from typing import Any

import yaml

from fsdpkit.contracts import defaults
from fsdpkit.k8s.derived import world_size
from fsdpkit.k8s.model import JobValues
from fsdpkit.ops.plan.calibration import CalibrationError
from fsdpkit.ops.plan.failures import PlanInputError
from fsdpkit.ops.plan.planner import job_summary

PLANNED_PROFILES = frozenset({"p5"})


def plan_lines(values: JobValues, config_yaml: str) -> tuple[str | None, list[str]]:
    """(the summary line or None, warnings) for the job rendered from `values` with trainer config
    `config_yaml` (the ConfigMap's train.yaml)."""
    if values.profile not in PLANNED_PROFILES or values.entrypoint:
        return None, []
    config: dict[str, Any] = yaml.safe_load(config_yaml) or {}
    checkpoint = config.get("checkpoint") or {}
    if checkpoint.get("mode", "async") == "off":
        return "plan: checkpoint mode off: every fault that loses a node restarts from step 0 (make plan)", []
    data = config.get("data") or {}
    model = (config.get("model") or {}).get("name")
    if not model or not data.get("seq_len") or not data.get("batch_size"):
        return None, []
    try:
        return job_summary(
            nodes=values.nodes,
            spares=values.spares,
            model=model,
            batch_tokens=world_size(values) * int(data["batch_size"]) * int(data["seq_len"]),
            tiers=checkpoint.get("tiers", "off") == "peer",
            interval=checkpoint.get("interval", defaults.CHECKPOINT_INTERVAL),
            replicate=(config.get("parallel") or {}).get("replicate", 1),
        )
    except (PlanInputError, CalibrationError) as exc:
        return f"plan: not computed ({exc})", []
