"""Typed values of one training Job: defaults, then stack outputs, then overrides; validated once.

`build_values()` is the only way in: it merges the three layers (`fsdpkit.k8s.outputs.values_from_outputs`,
then
`fsdpkit.k8s.overrides.apply_overrides`, which parses each override by its field type), and checks every rule
(`fsdpkit.k8s.rules`), raising `ValuesError` with one line that names the key, the value and the fix. After
that the values are trusted; `fsdpkit.k8s.spec` derives everything else (world size, env, command line).

The model, parsing, rules and derived numbers live in their own modules; the names other code uses are
importable from here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from fsdpkit.k8s.derived import (
    heartbeat_seconds,
    max_restarts,
    procs_per_node,
    shm_gib,
    staging_gib,
    world_size,
)
from fsdpkit.k8s.model import FSX_MOUNT, PLACEHOLDER, RUNS_ROOT, TRAINER_FIELDS, JobValues, ValuesError
from fsdpkit.k8s.outputs import placeholders, values_from_outputs
from fsdpkit.k8s.overrides import apply_overrides, parse_scalar
from fsdpkit.k8s.rules import advice, check_fields, check_rules, contains_credential, looks_secret

__all__ = [
    "FSX_MOUNT",
    "PLACEHOLDER",
    "RUNS_ROOT",
    "TRAINER_FIELDS",
    "JobValues",
    "ValuesError",
    "advice",
    "apply_overrides",
    "build_values",
    "contains_credential",
    "heartbeat_seconds",
    "looks_secret",
    "max_restarts",
    "parse_scalar",
    "procs_per_node",
    "shm_gib",
    "staging_gib",
    "world_size",
]


def build_values(
    *,
    outputs: Mapping[str, Any] | None = None,
    overrides: list[str] | Mapping[str, str] = (),
    allow_placeholders: bool = False,
    now: datetime | None = None,
) -> JobValues:
    """Defaults, then stack outputs, then overrides; every rule checked. The one way to make JobValues."""
    layered: dict[str, Any] = {}
    if outputs is not None:
        layered.update(values_from_outputs(outputs))
    layered = apply_overrides(layered, overrides)
    ecr = layered.pop("_ecr_repository", "")
    if not layered.get("image") and ecr:
        layered["image"] = f"{ecr}:{layered.get('image_tag', 'latest')}"
    if outputs is None and allow_placeholders:
        for name, value in placeholders(layered.get("profile", "p5")).items():
            if not layered.get(name):
                layered[name] = value
    if not layered.get("run_id"):
        stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
        layered["run_id"] = f"kit-{stamp}"
    values = JobValues(**layered)
    check_fields(values)
    check_rules(values, allow_placeholders=allow_placeholders)
    return values
