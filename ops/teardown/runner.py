"""Plan every kind, then (only when confirmed) run the steps in registry order and collect every result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import botocore.exceptions

from fsdpkit.ops.aws import Aws, describe_error
from fsdpkit.ops.teardown import filters, strategies
from fsdpkit.ops.teardown.model import Decision, Kind, Resource, Result, Scope, Unavailable
from fsdpkit.ops.teardown.registry import KINDS

# Exit codes (documented in docs/ops.md and the CLI's --help).
EXIT_OK = 0
"""Dry run printed; or everything planned was deleted and nothing was kept."""
EXIT_ERROR = 1
"""Aborted by an unexpected AWS error while finding the kit's resources, before any deletion."""
EXIT_USAGE = 2
"""Bad input (flags, region, credentials) or a wrong confirmation: nothing was deleted."""
EXIT_KEPT = 3
"""Finished without failures, but some resources were kept on purpose (data, protection, not owned)."""
EXIT_FAILED = 4
"""Some deletions failed or timed out (listed with reasons); fix the cause and rerun."""
EXIT_NOTHING = 5
"""Nothing tagged with the prefix in this region and account (already torn down, or a typo)."""


@dataclass(kw_only=True)
class Step:
    kind: Kind
    decisions: list[Decision] = field(default_factory=list)
    note: str = ""
    """Why the step was skipped or could not list (empty when it listed fine)."""
    error: bool = False
    """True when listing failed with an AWS error (counts as a failure)."""
    results: list[Result] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    """Side actions taken (e.g. security-group rules revoked), for the report."""


def selected_kinds(scope: Scope) -> tuple[Kind, ...]:
    only = scope.options.kinds
    return tuple(k for k in KINDS if not only or k.name in only)


def plan_step(kind: Kind, aws: Aws, scope: Scope) -> Step:
    step = Step(kind=kind)
    try:
        resources: list[Resource] = kind.list(aws, scope)
    except Unavailable as exc:
        step.note = f"skipped: {exc}"
        return step
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
        step.note = f"could not list: {describe_error(exc)}"
        step.error = True
        return step
    step.decisions = filters.plan(resources, scope)
    return step


def make_plan(aws: Aws, scope: Scope) -> list[Step]:
    return [plan_step(k, aws, scope) for k in selected_kinds(scope)]


def owned_count(steps: list[Step], scope: Scope) -> int:
    return sum(1 for s in steps for d in s.decisions if filters.ownership(d.resource, scope) is not None)


def execute(aws: Aws, scope: Scope, on_step: Callable[[Step], strategies.Tick]) -> list[Step]:
    """Each step re-lists (earlier steps change what exists), plans, deletes, waits; all get a result."""
    done: list[Step] = []
    for kind in selected_kinds(scope):
        step = plan_step(kind, aws, scope)
        tick = on_step(step)
        if step.decisions:
            try:
                step.results = strategies.run_step(kind, step.decisions, aws, scope, tick, step.actions)
            except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
                # e.g. AccessDenied on a call the kind needs: report the step, go on with the others
                step.note = f"step aborted: {describe_error(exc)}"
                step.error = True
        done.append(step)
    return done


def exit_code(steps: list[Step]) -> int:
    results = [r for s in steps for r in s.results]
    if any(s.error for s in steps) or any(r.status == "failed" for r in results):
        return EXIT_FAILED
    if any(r.status == "kept" for r in results):
        return EXIT_KEPT
    return EXIT_OK
