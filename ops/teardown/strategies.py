"""Shared deletion strategy: start every delete, retry dependency errors with backoff, wait until gone.

Throttling never reaches this module: botocore retries it (fsdpkit.ops.aws). What botocore does not retry are
the
"something still uses it" errors (DependencyViolation, ResourceInUse, VolumeInUse, ...): those usually clear
when an earlier deletion finishes, so they are retried here with exponential backoff until the step's
deadline, then reported as failed with the last error. Every item gets exactly one Result.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import botocore.exceptions

from fsdpkit.ops.aws import Aws, describe_error, error_code
from fsdpkit.ops.teardown.model import Decision, DeleteFailed, Kind, Resource, Result, Scope, Status

Tick = Callable[[int, int, str], None]
"""Progress callback: (items finished, items in the step, what we are waiting for)."""

DEPENDENCY_CODES = frozenset(
    {
        "DependencyViolation",
        "ResourceInUse",
        "ResourceInUseException",
        "InvalidNetworkInterface.InUse",
        "VolumeInUse",
        "IncorrectState",
        "IncorrectStateException",
        "BadRequest",  # FSx while a backup / data task is running
        "BackupInProgress",
        "InvalidGroup.InUse",
    }
)
"""Errors that mean "not yet": something else still uses the resource."""

NOT_FOUND_CODES = frozenset(
    {
        "InvalidVolume.NotFound",
        "InvalidInstanceID.NotFound",
        "InvalidNetworkInterfaceID.NotFound",
        "InvalidGroup.NotFound",
        "LoadBalancerNotFound",
        "TargetGroupNotFound",
        "ResourceNotFoundException",
        "FileSystemNotFound",
        "RepositoryNotFoundException",
        "NoSuchBucket",
        "NotFound",
    }
)
"""Errors that mean the resource is already gone: a rerun after a partial teardown is a no-op."""


def _now() -> float:
    return time.monotonic()


def run_step(
    kind: Kind,
    decisions: list[Decision],
    aws: Aws,
    scope: Scope,
    tick: Tick,
    actions: list[str] | None = None,
) -> list[Result]:
    """Delete the planned resources of one kind; keep decisions become `kept` results as they are.

    Side actions (e.g. revoked security-group rules) are appended to `actions` for the report.
    """
    opts = scope.options
    results: dict[str, Result] = {}
    for d in decisions:
        if d.action == "keep":
            results[d.resource.id] = Result(resource=d.resource, status="kept", reason=d.reason)
    doomed = [d.resource for d in decisions if d.action == "delete"]
    total = len(decisions)
    start = _now()
    deadline = start + opts.timeout_s

    def done(r: Resource, status: Status, reason: str) -> None:
        results[r.id] = Result(resource=r, status=status, reason=reason, seconds=_now() - start)
        tick(len(results), total, "")

    if doomed and kind.prepare is not None:
        prepared = kind.prepare(aws, doomed, scope)
        for note in prepared.notes:
            tick(len(results), total, note)
            if actions is not None:
                actions.append(note)
        for r in doomed:
            if r.id in prepared.keep:
                done(r, "kept", prepared.keep[r.id])
        doomed = [r for r in doomed if r.id not in prepared.keep]
    waves = kind.waves(aws, doomed) if (kind.waves and doomed) else [doomed]
    for index, wave in enumerate(waves):
        failed = [x.id for x in doomed if x.id in results and results[x.id].status == "failed"]
        if index and failed:
            # later waves depend on earlier ones (stacks: exporters after importers): do not try them
            for r in wave:
                done(
                    r,
                    "failed",
                    f"not attempted: waits for {', '.join(failed)} (earlier in the order), which failed",
                )
            continue
        deleting = _start_deletes(
            kind, wave, aws, scope, deadline, done, lambda n: tick(len(results), total, n)
        )
        _wait_gone(kind, deleting, aws, scope, deadline, done, lambda n: tick(len(results), total, n))
    return [results[d.resource.id] for d in decisions]


def _start_deletes(
    kind: Kind,
    wave: list[Resource],
    aws: Aws,
    scope: Scope,
    deadline: float,
    done: Callable[[Resource, Status, str], None],
    note: Callable[[str], None],
) -> list[Resource]:
    """Call delete on every item; round-robin retry the ones blocked by a dependency, with backoff."""
    opts = scope.options
    pending = list(wave)
    started: list[Resource] = []
    delay = opts.backoff_s
    while pending:
        blocked: list[tuple[Resource, BaseException]] = []
        for r in pending:
            try:
                kind.delete(aws, r, scope)
            except botocore.exceptions.ClientError as exc:
                code = error_code(exc)
                if code in NOT_FOUND_CODES:
                    done(r, "gone", "already deleted")
                elif code in DEPENDENCY_CODES:
                    blocked.append((r, exc))
                else:
                    done(r, "failed", describe_error(exc))
                continue
            except DeleteFailed as exc:
                done(r, "failed", str(exc))
                continue
            except botocore.exceptions.BotoCoreError as exc:
                done(r, "failed", describe_error(exc))
                continue
            if kind.state is None:
                done(r, "deleted", "deleted")
            else:
                started.append(r)
        if not blocked:
            break
        if _now() + delay > deadline:
            for r, exc in blocked:
                done(r, "failed", f"still blocked at the step timeout: {describe_error(exc)}; rerun later")
            break
        note(f"{len(blocked)} blocked ({error_code(blocked[0][1])}), retry in {delay:.1f}s")
        time.sleep(delay)
        delay = min(delay * 2, opts.backoff_max_s)
        pending = [r for r, _ in blocked]
    return started


def _wait_gone(
    kind: Kind,
    deleting: list[Resource],
    aws: Aws,
    scope: Scope,
    deadline: float,
    done: Callable[[Resource, Status, str], None],
    note: Callable[[str], None],
) -> None:
    """Poll until every started deletion is gone, failed, or the step deadline passes."""
    poll = kind.state
    if poll is None:
        return
    waiting = list(deleting)
    while waiting:
        still: list[tuple[Resource, str]] = []
        for r in waiting:
            try:
                state, detail = poll(aws, r)
            except botocore.exceptions.ClientError as exc:
                if error_code(exc) in NOT_FOUND_CODES:
                    state, detail = "gone", ""
                else:
                    state, detail = "deleting", describe_error(exc)
            except botocore.exceptions.BotoCoreError as exc:  # a dropped connection: poll again
                state, detail = "deleting", describe_error(exc)
            if state == "gone":
                done(r, "deleted", "deleted")
            elif state == "failed":
                done(r, "failed", detail)
            else:
                still.append((r, detail))
        if not still:
            return
        if _now() + scope.options.poll_s > deadline:
            for r, detail in still:
                why = f" (last: {detail})" if detail else ""
                done(r, "failed", f"timed out waiting for the deletion{why}; rerun teardown later")
            return
        note(f"waiting for {len(still)} deletion(s)")
        time.sleep(scope.options.poll_s)
        waiting = [r for r, _ in still]
