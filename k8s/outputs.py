"""Read the CDK stack outputs (design, contract 2) that `cdk deploy --outputs-file` writes.

The file maps each stack name to its outputs: `{"<Prefix>-Cluster": {...}, "<Prefix>-Storage": {...}}`.
All stacks are merged (unknown keys are kept and ignored by the caller); a key that two stacks give with
different values is an error, because then nobody can tell which cluster the job would land on.
`values_from_outputs` maps the merged outputs to JobValues fields (the middle layer of `build_values`), and
`placeholders` gives the marked stand-ins a dry run uses before the first deploy.
"""

from __future__ import annotations

import json
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fsdpkit.k8s.model import PLACEHOLDER, ValuesError
from fsdpkit.k8s.profiles import get_profile, profile_for_instance

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

OUTPUT_FIELDS: Mapping[str, str] = types.MappingProxyType(
    {
        "ClusterName": "cluster_name",
        "Region": "region",
        "FsxFileSystemId": "fsx_file_system_id",
        "FsxDnsName": "fsx_dns_name",
        "FsxMountName": "fsx_mount_name",
        "GpuNodeLabels": "node_selector",
        "GpuNodeTaint": "gpu_node_taint",
        "GpuInstanceType": "gpu_instance_type",
        "GpuNodeCount": "gpu_node_count",
        "GpuMaxNodes": "gpu_max_nodes",
        "FsxPvcName": "fsx_pvc",
        "FsxPvcNamespace": "fsx_pvc_namespace",
        "FsxStorageGiB": "fsx_storage_gib",
        "GpusPerNode": "gpus_per_node",
        "EfaDevicesPerNode": "efa_per_node",
        "KubernetesVersion": "kubernetes_version",
    }
)
"""Stack output key -> field. EcrRepositoryUri fills `image`; GpuInstanceType also picks the profile."""


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


def values_from_outputs(outputs: Mapping[str, Any]) -> dict[str, Any]:
    """Field values taken from merged stack outputs (see `fsdpkit.k8s.outputs`); unknown keys are ignored."""
    found: dict[str, Any] = {}
    for key, name in OUTPUT_FIELDS.items():
        if key not in outputs:
            continue
        raw = outputs[key]
        if name == "node_selector":
            found[name] = _parse_labels(raw)
        elif name in ("gpu_node_count", "gpu_max_nodes", "fsx_storage_gib", "gpus_per_node", "efa_per_node"):
            try:
                found[name] = int(raw)
            except (TypeError, ValueError):
                raise ValuesError(f"stack output {key}={raw!r} is not a whole number; redeploy") from None
        else:
            found[name] = str(raw)
    if "GpuInstanceType" in outputs:
        try:
            found["profile"] = profile_for_instance(str(outputs["GpuInstanceType"])).name
        except ValueError as exc:
            raise ValuesError(f"{exc}; set PROFILE= explicitly to override") from None
    if found.get("gpu_node_count"):
        found["nodes"] = found["gpu_node_count"]
    if found.get("fsx_pvc_namespace"):
        found["namespace"] = found["fsx_pvc_namespace"]  # a claim is namespaced: run where CDK made it
    if outputs.get("EcrRepositoryUri"):
        found["_ecr_repository"] = str(outputs["EcrRepositoryUri"])
    return found


def _parse_labels(raw: Any) -> dict[str, str]:
    try:
        labels = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        raise ValuesError(f"stack output GpuNodeLabels={raw!r} is not a JSON object; redeploy") from None
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise ValuesError(f"stack output GpuNodeLabels={raw!r} must be a JSON object of strings; redeploy")
    return {str(k): v for k, v in labels.items()}


def placeholders(profile: str) -> dict[str, Any]:
    """Clearly marked stand-ins for stack outputs, so a dry run renders readable manifests before a deploy."""
    if not get_profile(profile).requires_image:
        return {}
    return {
        "cluster_name": f"{PLACEHOLDER}-cluster",
        "region": f"{PLACEHOLDER}-region",
        "fsx_file_system_id": f"{PLACEHOLDER}-fsx-id",
        "fsx_dns_name": f"{PLACEHOLDER}-fsx-dns",
        "fsx_mount_name": f"{PLACEHOLDER}-fsx-mount",
        "image": f"{PLACEHOLDER}.invalid/kit-trainer:latest",
    }
