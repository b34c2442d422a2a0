"""A rank's request that its launcher evict this node, and the launcher's read of it.

With the straggler policy `replace` and a hot spare, the job agrees that a slow node must go. The ranks hold
no Kubernetes credentials and make no API call: the slow node's local rank 0 leaves a request in the kit
launcher's heartbeat folder (the channel the launcher already watches), and the launcher acts on its node
(training/launcher/node_actions.py: cordon and label it, then drain its pod, so every rank saves and
commits the agreed step and the spare takes the node's place). The file is written atomically (a temporary
file, then a rename) and read as JSON data; the launcher takes it once (rename, then read).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

REQUEST_FILE = "evict.json"
_TAKEN = ".taken"


@dataclass(frozen=True, kw_only=True)
class EvictionRequest:
    """Why this node should leave, as the job agreed it."""

    rank: int
    """The slow rank that made the job evict its node."""
    step: int
    """The step at which the job agreed."""
    pod: int
    """The pod's node index (the Job completion index)."""
    reason: str
    """One line for the node's annotation: which run, pod and rank, how much slower, since which step."""


def request_eviction(directory: str | os.PathLike[str], request: EvictionRequest) -> Path:
    """Leave `request` for the launcher watching `directory`; returns the file written."""
    path = Path(directory) / REQUEST_FILE
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(request)), encoding="utf-8")
    tmp.replace(path)
    return path


def take_eviction(directory: str | os.PathLike[str]) -> EvictionRequest | str | None:
    """The request left in `directory`, taken so it is acted on once; None when there is none; a line saying
    why when the file is not a request (it is set aside either way)."""
    path = Path(directory) / REQUEST_FILE
    taken = path.with_name(path.name + _TAKEN)
    try:
        path.replace(taken)
    except FileNotFoundError:
        return None
    try:
        fields = json.loads(taken.read_bytes().decode("utf-8"))
        request = EvictionRequest(
            rank=int(fields["rank"]),
            step=int(fields["step"]),
            pod=int(fields["pod"]),
            reason=str(fields["reason"]),
        )
    except (OSError, ValueError, TypeError, KeyError) as exc:
        return f"{path} is not an eviction request ({exc.__class__.__name__}: {exc}); ignored"
    return request
