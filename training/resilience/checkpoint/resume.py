"""Pick the newest committed step whose files verify, agreed by every rank, and load it with DCP.

Rank 0 lists the committed steps and broadcasts them, so every rank tries the same ones in the same
order. A step is used only if its record is for this step and lists exactly the files of the world size
that wrote it (`.metadata` and one shard per rank), and every one of those files matches its size and
checksum; the files are verified in parallel (file i by rank i % world_size), and the ranks agree on the
verdict before anyone loads. A damaged newest step falls back to the one before it; if steps are committed
but none verifies, resume fails loudly instead of starting again from step 0.

A commit record proves integrity, not origin (another run's pod can plant a step folder with correct CRCs),
so nothing of a step is loaded by a general unpickler (fsdpkit.resilience.checkpoint.untrusted): rank 0 reads
`.metadata` through the allowlisted unpickler while it verifies, and DCP's load reads it and every byte item
the same way. A refused file is damage like a bad checksum: one line naming the file and the refused type,
and the step before serves. A step that verifies but does not load into this state (another model or
optimizer) is passed over the same way; only when no committed step loads does resume fail, naming the
newest step's reason.

A checkpoint written by another world size is resharded (DCP splits the model and optimizer anew) when
its record and this job's `ReshardPolicy` allow it (checkpoint/reshard.py: the same global batch, no
per-rank state); otherwise it is refused (CheckpointError naming both sizes and why): `check_world_size`
before any process group, and again here with the state's own policy. Rank 0 names each skipped folder
once, in one line: damaged, or newer than the step resumed from but without a commit record (its save
never finished).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem

from fsdpkit.resilience.checkpoint.comm import SAVE_ERRORS, CheckpointComm
from fsdpkit.resilience.checkpoint.commit import (
    METADATA_FILE,
    CommitRecord,
    file_set_problem,
    read_commit,
    shard_name,
    verify_file,
)
from fsdpkit.resilience.checkpoint.layout import COMMIT_FILE, is_committed, list_steps, step_dir
from fsdpkit.resilience.checkpoint.reshard import ReshardPolicy, refusal
from fsdpkit.resilience.checkpoint.shared_reads import SHARED_READS, MeteredRaw
from fsdpkit.resilience.checkpoint.untrusted import Refused, SafeLoadPlanner, SafeReader, read_metadata_file
from fsdpkit.resilience.state import TrainState

log = logging.getLogger("fsdpkit.resilience.checkpoint")


class CheckpointError(RuntimeError):
    """No committed checkpoint can be trusted, or a verified one does not fit the state; one line."""


@dataclass
class Resumed:
    step: int | None
    fallback_from: int | None = None
    rejected: dict[int, str] = field(default_factory=dict)
    """Step -> why it was not used."""
    resharded_from: int | None = None
    """The world size that wrote the step loaded, when it is not this job's (a resharded resume)."""


def check_world_size(root: Path, world_size: int, policy: ReshardPolicy) -> None:
    """Before any process group: CheckpointError if the newest readable committed step of `root` was written
    by another world size and may not be resharded into `world_size` ranks under `policy`. Unreadable
    records are left to resume (damaged)."""
    record = newest_record(root)
    if record is not None and (why := refusal(record, step_dir(root, record.step), world_size, policy)):
        raise CheckpointError(why)


def newest_record(root: Path) -> CommitRecord | None:
    """The newest readable commit record under `root` (None if none): what a script plans its batch from
    before any process group (`fsdpkit.resilience.batch`). A folder without a record (its save never
    finished) or with an unreadable one is passed over."""
    for step in reversed(list_steps(root)):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
            return read_commit(step_dir(root, step))
    return None


def record_problem(record: CommitRecord, step: int) -> str | None:
    """Why a readable record cannot describe a complete checkpoint of its step, or None."""
    if record.step != step:
        return f"{COMMIT_FILE} is for step {record.step}"
    problem = file_set_problem(set(record.files), record.world_size)
    return f"{COMMIT_FILE} {problem}" if problem else None


def _problems(
    comm: CheckpointComm, folder: Path, step: int, *, checksum: bool, policy: ReshardPolicy
) -> tuple[str | None, CommitRecord | None]:
    """Every rank verifies its share of the step's files; all ranks get the same verdict and the record.
    CheckpointError (on every rank) if the step is for another world size and may not be resharded."""
    record, error, refused = None, None, None
    if comm.rank == 0:
        try:
            record = read_commit(folder)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            error = f"{COMMIT_FILE} unreadable ({one_line(exc)})"
        else:
            refused = refusal(record, folder, comm.world_size, policy)
            error = record_problem(record, step)
    record, error, refused = comm.broadcast_from_zero((record, error, refused))
    if refused:
        raise CheckpointError(refused)
    if error:
        return error, record
    mine = verification_share(sorted(record.files), comm.rank, comm.world_size)
    local = [
        p
        for name in mine
        if (p := verify_file(folder, name, record.files[name], checksum=checksum, meter=SHARED_READS))
    ]
    if comm.rank == 0 and not local:
        local += _metadata_problem(folder)
    gathered = comm.gather_to_zero(local)
    verdict = "; ".join(p for ps in gathered for p in ps) if gathered is not None else None
    return comm.broadcast_from_zero(verdict) or None, record


def _metadata_problem(folder: Path) -> list[str]:
    """Rank 0, once `.metadata` verified: [] if it reads through the allowlisted unpickler, else why not."""
    try:
        read_metadata_file(folder / METADATA_FILE)
    except Refused as exc:
        return [str(exc)]
    except OSError as exc:
        return [f"{METADATA_FILE}: {one_line(exc)}"]
    return []


def verification_share(names: list[str], rank: int, world_size: int) -> list[str]:
    """The files `rank` verifies: its own shard (on the world size that wrote the step, the file its load
    then reads, from the page cache on shared storage, instead of a second read), `.metadata` on rank 0,
    any other file by turns (after a reshard, the shards of ranks this world does not have)."""
    own = {shard_name(r): r for r in range(world_size)} | {METADATA_FILE: 0}
    others = [n for n in names if n not in own]
    return [n for n in names if own.get(n) == rank] + others[rank::world_size]


class _MeteredFileSystem(FileSystem):
    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[io.IOBase, None, None]:
        if mode != "rb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with io.BufferedReader(MeteredRaw(Path(path)), buffer_size=1 << 20) as stream:
            yield stream


class SharedReader(SafeReader):
    """DCP's file system reader, `.metadata` through the allowlisted unpickler (SafeReader), with every
    byte it reads counted (and, for benchmarks, paced) by SHARED_READS (checkpoint/shared_reads.py)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self.fs = _MeteredFileSystem()


_reported: set[Path] = set()
"""Folders rank 0 already named as skipped in this process (an in-process restart resumes again)."""


def _skip(comm: CheckpointComm, folder: Path, why: str) -> None:
    """One line per skipped folder and job: rank 0 only, once per process."""
    if comm.rank == 0 and folder not in _reported:
        _reported.add(folder)
        log.warning("checkpoint folder %s skipped: %s", folder, why)


def _report_uncommitted(comm: CheckpointComm, root: Path, steps: list[int], after: int | None) -> None:
    for step in steps:
        if (after is None or step > after) and not is_committed(root, step):
            _skip(comm, step_dir(root, step), f"no {COMMIT_FILE} (its save never finished)")


def resume(
    comm: CheckpointComm,
    root: Path,
    state: dict[str, Any],
    *,
    checksum: bool,
    policy: ReshardPolicy | None = None,
) -> Resumed:
    """Load the newest verified committed step into `state`; Resumed(step=None) when nothing is committed.
    A step of another world size is resharded when `policy` allows it (its TrainStates then leave their
    per-rank keys out of the load and reseed: `TrainState.resharding`)."""
    policy = policy or ReshardPolicy()
    committed, steps = None, []
    if comm.rank == 0:
        steps = list_steps(root)
        committed = [s for s in reversed(steps) if is_committed(root, s)]
    committed = comm.broadcast_from_zero(committed)
    SHARED_READS.forget_cached()
    result = Resumed(step=None)
    unfit: str | None = None
    """The newest step's reason it verifies but does not load into this state."""
    for step in committed:
        folder = step_dir(root, step)
        problem, record = _problems(comm, folder, step, checksum=checksum, policy=policy)
        if problem is None:
            problem, unloadable = _load(comm, folder, record, state)
            if problem is None:
                result.step = step
                result.resharded_from = record.world_size if record.world_size != comm.world_size else None
                if step != committed[0]:
                    result.fallback_from = committed[0]
                _report_uncommitted(comm, root, steps, step)
                return result
            if unloadable:
                unfit = (
                    unfit or f"checkpoint {folder} verifies but does not fit this model/optimizer ({problem})"
                )
                _skip(comm, folder, f"does not load into this state ({problem}); trying an older step")
                result.rejected[step] = f"does not fit ({problem})"
                continue
        _skip(comm, folder, f"damaged ({problem}); trying an older step")
        result.rejected[step] = problem
    _report_uncommitted(comm, root, steps, None)
    if unfit:
        raise CheckpointError(f"{unfit}: resume with the config that wrote it, or use a new run.id")
    if committed:
        reasons = "; ".join(f"step {s}: {why}" for s, why in result.rejected.items())
        raise CheckpointError(
            f"{len(committed)} committed checkpoint(s) in {root} but none verifies ({reasons}): "
            "restore them from a backup, or move the folder aside to start from step 0"
        )
    return result


def _load(
    comm: CheckpointComm, folder: Path, record: CommitRecord | None, state: dict[str, Any]
) -> tuple[str | None, bool]:
    """Collective: DCP's load of a verified step into `state` (its TrainStates resharding when the step's
    world size is not this job's). (None, False) when it loaded; else (why, True) when the step does not
    load into this state, (why, False) when a file holds a refused type (damage); every rank gets the same
    answer (DCP agrees on a failure before it raises). CheckpointError for what is not the step's fault
    (the group gone, a peer lost)."""
    resharded = record is not None and record.world_size != comm.world_size
    trainstates = [v for v in state.values() if isinstance(v, TrainState)]
    for value in trainstates:
        value.resharding = resharded
    try:
        dcp.load(
            state,
            checkpoint_id=folder,
            storage_reader=SharedReader(folder),
            planner=SafeLoadPlanner(folder),
            process_group=comm.group,
            no_dist=not comm.distributed,
        )
    except CheckpointException as exc:
        failures = [f[0] if isinstance(f, tuple) else f for f in exc.failures.values()]
        refused = [str(f) for f in failures if isinstance(f, Refused)]
        return (refused[0], False) if refused else (one_line(exc), True)
    except SAVE_ERRORS as exc:
        raise CheckpointError(f"checkpoint {folder} could not be loaded ({one_line(exc)})") from exc
    finally:
        for value in trainstates:
            value.resharding = False
    return None, False


def one_line(exc: BaseException) -> str:
    """A short, single-line cause; DCP's CheckpointException is unwrapped to each rank's own error."""
    if isinstance(exc, CheckpointException):
        return "; ".join(f"rank {r}: {one_line(e[0])}" for r, e in sorted(exc.failures.items()))
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"
