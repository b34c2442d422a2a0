"""Read the CDK stack outputs (design, contract 2) that `cdk deploy --outputs-file` writes.

The file maps each stack name to its outputs: `{"<Prefix>-Cluster": {...}, "<Prefix>-Storage": {...}}`.
All stacks are merged (unknown keys are kept and ignored by the caller); a key that two stacks give with
different values is an error, because then nobody can tell which cluster the job would land on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REQUIRED_KEYS: tuple[str, ...] = (
    "ClusterName",
    "Region",
    "FsxFileSystemId",
    "FsxDnsName",
    "FsxMountName",
    "EcrRepositoryUri",
    "GpuNodeLabels",
    "GpuNodeTaint",
    "GpuInstanceType",
    "GpuNodeCount",
)
"""Keys `make train-job` needs; anything else in the file is tolerated."""


class OutputsError(ValueError):
    """A stack outputs file that cannot be used; the message is one line and says what to fix."""


def merge_stack_outputs(data: Any, *, source: str = "stack outputs") -> dict[str, Any]:
    """Merge the per-stack output maps into one flat map; checks shape, conflicts and required keys."""
    if not isinstance(data, Mapping) or not all(isinstance(v, Mapping) for v in data.values()):
        raise OutputsError(
            f"{source}: expected {{stack name: {{output: value}}}} as written by 'cdk deploy --outputs-file'"
        )
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for stack in sorted(data):
        for key, value in data[stack].items():
            if key in merged and merged[key] != value:
                raise OutputsError(
                    f"{source}: output {key} differs between stacks {origin[key]} ({merged[key]!r}) and "
                    f"{stack} ({value!r}); deploy one kit per outputs file"
                )
            merged[key] = value
            origin[key] = stack
    missing = [k for k in REQUIRED_KEYS if k not in merged]
    if missing:
        raise OutputsError(
            f"{source}: missing output {missing[0]}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            + "; redeploy with 'make deploy' (it writes every output) or pass the value on the command line"
        )
    return merged


def load_stack_outputs(path: str | Path) -> dict[str, Any]:
    """Read and merge an outputs file; OutputsError for a missing, unreadable or incomplete file."""
    file = Path(path)
    if not file.is_file():
        raise OutputsError(
            f"stack outputs file {file} not found; run 'make deploy' first, pass OUTPUTS=<file>, "
            "or use DRY_RUN=1 to render with placeholders"
        )
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OutputsError(
            f"stack outputs file {file} is not valid JSON ({exc}); rerun 'make deploy'"
        ) from None
    return merge_stack_outputs(data, source=str(file))
