"""Which checkpoint to export: the newest commit that verifies (as a resume picks it), or the step asked for.

The checks are the kit's own (fsdpkit.resilience.checkpoint): a step exists only with its commit record;
the record must list exactly the files of its world size; every file must match its size and checksum.
A damaged newest step falls back to the one before, with a warning; a step asked for by `--step` is
exported only if it verifies. The files are checksummed in parallel threads (the CRC releases the GIL).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from fsdpkit.contracts.run_layout import CHECKPOINTS_DIR, COMMIT_FILE, STEP_DIR
from fsdpkit.export.errors import ExportError
from fsdpkit.resilience.checkpoint.commit import CommitRecord, read_commit, verify_file
from fsdpkit.resilience.checkpoint.layout import checkpoints_dir, is_committed, list_steps, step_dir
from fsdpkit.resilience.checkpoint.resume import one_line, record_problem

_THREADS = 4
"""Files checksummed at once, at most (and no more than the cores)."""
_LISTED = 5
"""Committed steps a refusal lists (the newest)."""


@dataclass(frozen=True)
class Chosen:
    """The step to export and why newer ones were passed over."""

    step: int
    folder: Path
    record: CommitRecord
    skipped: list[tuple[int, str]] = field(default_factory=list)
    """(step, why) of newer committed steps that do not verify, newest first."""


def checkpoint_root(run: Path) -> tuple[Path, int | None]:
    """(the checkpoints folder, the step when `run` names a step folder) of what the user gave: a run folder,
    its checkpoints/ folder, or one step_<N> folder in it."""
    if not run.exists():
        raise ExportError(
            f"run folder {run} does not exist: give <run.root>/<run.id>, the folder holding "
            f"{CHECKPOINTS_DIR}/"
        )
    if not run.is_dir():
        raise ExportError(f"{run} is a file: give the run folder holding {CHECKPOINTS_DIR}/")
    match = STEP_DIR.match(run.name)
    if match:
        return run.parent, int(match.group(1))
    root = run if run.name == CHECKPOINTS_DIR else checkpoints_dir(run)
    if not root.is_dir():
        raise ExportError(
            f"{run} has no {CHECKPOINTS_DIR}/ folder: not a run folder, or the run saved nothing"
        )
    return root, None


def _committed_list(committed: list[int]) -> str:
    shown = ", ".join(str(s) for s in committed[-_LISTED:])
    return (
        f"committed: {'..., ' if len(committed) > _LISTED else ''}{shown}" if committed else "none committed"
    )


def problem(folder: Path, step: int, *, checksum: bool) -> tuple[str | None, CommitRecord | None]:
    """Why step `step` in `folder` does not verify (None if it does), and its record when readable."""
    try:
        record = read_commit(folder)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{COMMIT_FILE} unreadable ({one_line(exc)})", None
    if why := record_problem(record, step):
        return why, record
    names = sorted(record.files)
    threads = max(1, min(_THREADS, os.cpu_count() or 1, len(names)))
    with ThreadPoolExecutor(threads, thread_name_prefix="kit-export-verify") as pool:
        found = pool.map(lambda n: verify_file(folder, n, record.files[n], checksum=checksum), names)
        problems = [p for p in found if p]
    return ("; ".join(problems) or None), record


def choose(
    run: Path, step: int | None, *, checksum: bool, warn: Callable[[str], None] = lambda line: None
) -> Chosen:
    """The step to export: `step`, which must verify, or the newest that verifies (`warn` hears, in one line
    each, the newer ones skipped). ExportError when there is none."""
    root, named = checkpoint_root(run)
    if named is not None and step is not None and named != step:
        raise ExportError(f"{run} is step {named} but --step {step} was given: give one of them")
    step = named if named is not None else step
    steps = list_steps(root)
    committed = [s for s in steps if is_committed(root, s)]
    if not committed:
        unfinished = f" ({len(steps)} step folder(s) without {COMMIT_FILE}: their saves never finished)"
        raise ExportError(f"no committed checkpoint in {root}{unfinished if steps else ''}")
    if step is not None:
        if step not in committed:
            why = (
                f"has no {COMMIT_FILE} in {root} (its save never finished)"
                if step in steps
                else f"is not in {root}"
            )
            raise ExportError(f"step {step} {why}: pick a committed one ({_committed_list(committed)})")
        why, record = problem(step_dir(root, step), step, checksum=checksum)
        if why or record is None:
            others = [s for s in committed if s != step]
            raise ExportError(
                f"step {step} in {root} does not verify: {why}; restore it from a backup or "
                f"export another --step ({_committed_list(others)})"
            )
        return Chosen(step, step_dir(root, step), record)
    skipped: list[tuple[int, str]] = []
    for candidate in reversed(committed):
        why, record = problem(step_dir(root, candidate), candidate, checksum=checksum)
        if why is None and record is not None:
            return Chosen(candidate, step_dir(root, candidate), record, skipped)
        skipped.append((candidate, why or "unreadable"))
        warn(f"step {candidate} skipped: it does not verify ({why}); trying an older step")
    reasons = "; ".join(f"step {s}: {why}" for s, why in skipped[:3])
    raise ExportError(
        f"{len(committed)} committed checkpoint(s) in {root} but none verifies ({reasons}): "
        "restore them from a backup"
    )
