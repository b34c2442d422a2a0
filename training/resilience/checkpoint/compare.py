"""Read a committed checkpoint back from disk as plain values, and compare two of them value by value.

The kit's guarantee (a fault changes nothing but time) is proven on what a later resume would see: the
persisted final checkpoint, verified like resume verifies it (the record lists exactly the files of its
world size; every file's size and CRC32 match), loaded without any process group into full (unsharded)
tensors through the same allowlisted loaders as resume (fsdpkit.resilience.checkpoint.untrusted), and
compared with a fault-free run's: model, optimizer, scheduler, data position, step and each rank's RNG.
Used by the tests and by `make demo`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from fsdpkit.resilience.checkpoint.commit import METADATA_FILE, read_commit, verify_file
from fsdpkit.resilience.checkpoint.layout import checkpoints_dir, is_committed, list_steps, step_dir
from fsdpkit.resilience.checkpoint.resume import CheckpointError, one_line, record_problem
from fsdpkit.resilience.checkpoint.untrusted import Refused, SafeLoadPlanner, SafeReader, read_metadata_file


def final_checkpoint(run_dir: str | Path) -> Path:
    """The newest committed step folder of a run; CheckpointError if there is none."""
    root = checkpoints_dir(run_dir)
    committed = [s for s in list_steps(root) if is_committed(root, s)]
    if not committed:
        raise CheckpointError(f"no committed checkpoint in {root}")
    return step_dir(root, committed[-1])


def load_committed(folder: str | Path) -> dict[str, Any]:
    """Every value of a committed checkpoint, verified as resume verifies it, keyed by its path
    ("train/model/tok_embeddings.weight", "train/step", ...); tensors are full, on the CPU."""
    folder = Path(folder)
    try:
        record = read_commit(folder)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{folder}: commit record unreadable ({one_line(exc)})") from exc
    problems = [record_problem(record, int(folder.name.removeprefix("step_")))]
    problems += [verify_file(folder, name, e, checksum=True) for name, e in sorted(record.files.items())]
    if found := [p for p in problems if p]:
        raise CheckpointError(f"{folder}: {'; '.join(found)}")
    try:
        return _read_all(folder)
    except (Refused, CheckpointException) as exc:
        raise CheckpointError(f"{folder}: {one_line(exc)}") from None


def _read_all(folder: Path) -> dict[str, Any]:
    """Every item of a step folder (one process, no group): each tensor whole, from every rank's chunks."""
    metadata = read_metadata_file(folder / METADATA_FILE)
    state: dict[str, Any] = {
        key: torch.empty(entry.size, dtype=entry.properties.dtype)
        if isinstance(entry, TensorStorageMetadata)
        else None
        for key, entry in metadata.state_dict_metadata.items()
    }
    dcp.load(state, storage_reader=SafeReader(folder), planner=SafeLoadPlanner(folder), no_dist=True)
    paths = metadata.planner_data if isinstance(metadata.planner_data, dict) else {}
    out: dict[str, Any] = {}
    for key, value in state.items():
        path = paths.get(key)
        out.update(_flat(value, "/".join(map(str, path)) if isinstance(path, tuple) else key))
    return out


def _flat(obj: Any, path: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        return {k: v for key, val in obj.items() for k, v in _flat(val, f"{path}/{key}".lstrip("/")).items()}
    if isinstance(obj, (list, tuple)):
        return {k: v for i, val in enumerate(obj) for k, v in _flat(val, f"{path}/{i}").items()}
    return {path: obj}


@dataclass
class Comparison:
    """The outcome of comparing two checkpoints."""

    compared: int = 0
    """Values compared (tensors and others)."""
    differ: list[str] = field(default_factory=list)
    """Paths whose values differ, or that only one side has."""
    groups: set[str] = field(default_factory=set)
    """What was covered: the second path component ("model", "optim", "scheduler", "data", "rng.rank0")."""

    @property
    def equal(self) -> bool:
        return not self.differ and self.compared > 0

    def summary(self) -> str:
        if self.equal:
            return f"{self.compared} values equal ({', '.join(sorted(self.groups))})"
        return f"{len(self.differ)} of {self.compared} values differ, e.g. {', '.join(self.differ[:5])}"


def compare_values(a: dict[str, Any], b: dict[str, Any]) -> Comparison:
    """Bitwise comparison of two loaded checkpoints (same dtype and bits for every tensor, == otherwise)."""
    result = Comparison(differ=sorted(set(a) ^ set(b)))
    for key in sorted(set(a) & set(b)):
        x, y = a[key], b[key]
        result.compared += 1
        result.groups.add(key.split("/")[1] if "/" in key else key)
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            same = isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
            same = same and x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
        else:
            same = (callable(x) and callable(y)) or x == y  # a schedule's lambda is code, not state
        if not same:
            result.differ.append(key)
    return result


def compare_checkpoints(a: str | Path, b: str | Path) -> Comparison:
    """Load two committed checkpoint folders from disk and compare them value by value."""
    return compare_values(load_committed(a), load_committed(b))
