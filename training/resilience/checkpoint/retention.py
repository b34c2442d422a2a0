"""Keep the newest k committed checkpoints; never delete the newest committed step or the one in flight.

Run by rank 0 right after a commit. Uncommitted folders older than the newest commit are leftovers of
killed saves and go too; uncommitted folders newer than it are left alone (a save may be writing them).
"""

from __future__ import annotations

from pathlib import Path

from fsdpkit.resilience.checkpoint.layout import is_committed, list_steps, remove_step


def plan_deletions(root: Path, *, keep: int, in_flight: int | None) -> list[int]:
    """Steps to delete: committed beyond the newest `keep`, and dead uncommitted ones below the newest."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    steps = list_steps(root)
    committed = [s for s in steps if is_committed(root, s)]
    if not committed:
        return []
    newest = committed[-1]
    kept = set(committed[-keep:]) | {newest}
    if in_flight is not None:
        kept.add(in_flight)
    return [s for s in steps if s not in kept and s < newest]


def prune(root: Path, *, keep: int, in_flight: int | None) -> list[int]:
    """Delete what `plan_deletions` names (commit record first, so a half-deleted step never counts)."""
    deleted = []
    for step in plan_deletions(root, keep=keep, in_flight=in_flight):
        remove_step(root, step)
        deleted.append(step)
    return deleted
