"""Pick the newest committed step whose files verify, agreed by every rank, and load it with DCP.

Rank 0 lists the committed steps and broadcasts them, so every rank tries the same ones in the same
order. The files of a step are verified in parallel (file i by rank i % world_size), and the ranks agree
on the verdict before anyone loads. A damaged newest step falls back to the one before it; if steps are
committed but none verifies, resume fails loudly instead of starting again from step 0.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from training.checkpoint.comm import SAVE_ERRORS, CheckpointComm
from training.checkpoint.commit import read_commit, verify_file
from training.checkpoint.layout import is_committed, list_steps, step_dir

log = logging.getLogger("training.checkpoint")


class CheckpointError(RuntimeError):
    """No committed checkpoint can be trusted, or a verified one does not fit the state; one line."""


@dataclass
class Resumed:
    step: int | None
    fallback_from: int | None = None
    rejected: dict[int, str] = field(default_factory=dict)
    """Step -> why it was not used."""


def _problems(comm: CheckpointComm, folder: Path, *, checksum: bool) -> str | None:
    """Every rank verifies its share of the step's files; all ranks get the same verdict."""
    try:
        record = read_commit(folder) if comm.rank == 0 else None
        error = None
    except (OSError, ValueError, KeyError) as exc:
        record, error = None, f"commit.json unreadable ({exc})"
    record, error = comm.broadcast_from_zero((record, error))
    if error:
        return error
    mine = sorted(record.files)[comm.rank :: comm.world_size]
    local = [p for name in mine if (p := verify_file(folder, name, record.files[name], checksum=checksum))]
    gathered = comm.gather_to_zero(local)
    verdict = "; ".join(p for ps in gathered for p in ps) if gathered is not None else None
    return comm.broadcast_from_zero(verdict) or None


def resume(comm: CheckpointComm, root: Path, state: dict[str, Any], *, checksum: bool) -> Resumed:
    """Load the newest verified committed step into `state`; Resumed(step=None) when nothing is committed."""
    committed = None
    if comm.rank == 0:
        committed = [s for s in reversed(list_steps(root)) if is_committed(root, s)]
    committed = comm.broadcast_from_zero(committed)
    result = Resumed(step=None)
    for step in committed:
        folder = step_dir(root, step)
        problem = _problems(comm, folder, checksum=checksum)
        if problem:
            log.warning("checkpoint step %d is damaged, trying an older one: %s", step, problem)
            result.rejected[step] = problem
            continue
        try:
            dcp.load(state, checkpoint_id=folder, process_group=comm.group, no_dist=not comm.distributed)
        except SAVE_ERRORS as exc:
            raise CheckpointError(
                f"checkpoint {folder} verifies but does not fit this model/optimizer ({one_line(exc)}): "
                "resume with the config that wrote it, or use a new run.id"
            ) from exc
        result.step = step
        if step != committed[0]:
            result.fallback_from = committed[0]
        return result
    if committed:
        reasons = "; ".join(f"step {s}: {why}" for s, why in result.rejected.items())
        raise CheckpointError(
            f"{len(committed)} committed checkpoint(s) in {root} but none verifies ({reasons}): "
            "restore them from a backup, or move the folder aside to start from step 0"
        )
    return result


def one_line(exc: BaseException) -> str:
    """A short, single-line cause; DCP's CheckpointException is unwrapped to each rank's own error."""
    if isinstance(exc, CheckpointException):
        return "; ".join(f"rank {r}: {one_line(e[0])}" for r, e in sorted(exc.failures.items()))
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"
