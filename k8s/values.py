"""Typed values of one training Job: defaults, then stack outputs, then overrides; validated once.

`build_values()` is the only way in: it merges the three layers, parses every override by its field type,
and checks every rule, raising `ValuesError` with one line that names the key, the value and the fix.
After that the values are trusted; `k8s.spec` derives everything else (world size, env, command line).

Override keys are the field names, case-insensitive (`NODES=4`, `model=llama3.1-8b`, `checkpoint-mode=sync`),
plus three maps: `ENV.<NAME>=<value>` (container env), `NODE_SELECTOR.<label>=<value>`, and
`TRAIN.<section>.<field>=<value>` (trainer config fields that have no field of their own, e.g.
`TRAIN.optim.lr=1e-4`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from k8s.profiles import ProfileName, get_profile, profile_for_instance

Launcher = Literal["kit", "ft_launcher", "torchrun"]
ModelName = Literal["tiny", "small", "llama3.1-8b"]
DataKind = Literal["synthetic", "shards"]
CheckpointMode = Literal["off", "sync", "async"]
CheckpointBackend = Literal["kit", "dcp", "nvrx"]
InprocessBackend = Literal["kit", "nvrx"]
PullPolicy = Literal["Always", "IfNotPresent"]

FSX_MOUNT = "/fsx"
"""Where the FSx volume is mounted in every pod."""
RUNS_ROOT = f"{FSX_MOUNT}/runs"
"""run.root of every Job: one folder per run id below it (contract 3), never shared between runs."""
PLACEHOLDER = "PLACEHOLDER"
"""Prefix of the values a dry run fills in when no stack outputs exist; `apply` refuses them."""

# Trainer config fields (contract 4). Fields that JobValues types itself may not be set through TRAIN.*.
TRAINER_FIELDS: Mapping[str, tuple[str, ...]] = types.MappingProxyType(
    {
        "run": ("id", "root", "seed"),
        "model": ("name",),
        "data": ("kind", "path", "seq_len", "batch_size"),
        "optim": ("lr", "min_lr", "warmup_steps", "weight_decay", "grad_clip"),
        "training": ("steps", "log_every", "deterministic"),
        "checkpoint": ("mode", "interval", "keep", "backend"),
        "fault": ("spec", "schedule_seed", "schedule_count", "schedule_kinds", "schedule_after_step"),
        "inprocess": ("enabled", "backend", "max_restarts", "barrier_timeout_s"),
    }
)

# Env names the launcher or the Job controller own. Users may not set them (kubeflow trainer's rule).
RESERVED_ENV: frozenset[str] = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "ROLE_RANK",
        "NODE_RANK",
        "NNODES",
        "NPROC_PER_NODE",
        "JOB_COMPLETION_INDEX",
        "KIT_HEARTBEAT_DIR",
        "KIT_CONFIG",
        "RUN_ID",
        "RUN_DIR",
        "POD_NAME",
        "POD_IP",
        "POD_NAMESPACE",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
    }
)
RESERVED_ENV_PREFIXES: tuple[str, ...] = ("TORCHELASTIC_", "PET_")

# Parameter counts used only to size /dev/shm for async checkpoint staging (upper bounds).
MODEL_PARAMS: Mapping[str, float] = types.MappingProxyType({"tiny": 2e6, "small": 5e7, "llama3.1-8b": 8.03e9})
CKPT_BYTES_PER_PARAM = 12
"""fp32 parameters + two AdamW moments: what one checkpoint holds per parameter."""

LAUNCHER_DEFAULT_RESTARTS: Mapping[str, int] = types.MappingProxyType(
    {"kit": 10, "ft_launcher": 20, "torchrun": 0}
)
FT_AUTO_HEARTBEAT_S = 900.0
"""ft_launcher has no "auto" heartbeat; the study's --ft-rank-heartbeat-timeout is used instead."""

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_TAINT = re.compile(
    r"^(?P<key>[^=:\s]+)(=(?P<value>[^:\s]*))?:(?P<effect>NoSchedule|PreferNoSchedule|NoExecute)$"
)
_FAULT = re.compile(
    r"^(?P<kind>kill|hang|sigstop|exception|oom):(?P<when>step|time)=(?P<at>[0-9.]+):rank=(?P<rank>\d+)$"
)
_KINDS = re.compile(
    r"^(kill|hang|sigstop|exception|oom):[0-9.]+(,(kill|hang|sigstop|exception|oom):[0-9.]+)*$"
)
RUN_ID_MAX = 48
"""Leaves room for `-<index>` in pod hostnames and `-config` in the ConfigMap name (63-char labels)."""


class ValuesError(ValueError):
    """A value that breaks a rule; the message is one line: the key, the value seen, the rule and the fix."""


@dataclass(kw_only=True)
class JobValues:
    """Everything a user may choose for one training Job. Field docs feed docs/k8s.md (`k8s.docs`)."""

    # -- job --
    run_id: str = ""
    """Run id: names the Job, its Service and ConfigMap, and the run folder /fsx/runs/<run_id>. Lower-case
    letters, digits and '-', starting with a letter, at most 48 characters. Empty: generated from the UTC
    time (kit-YYYYMMDD-HHMMSS). Reuse an id only to resume that run."""
    namespace: str = "kit-training"
    """Kubernetes namespace of the Job (created if missing)."""
    profile: ProfileName = "p5"
    """Node profile: p5, p4d, g5 or local (CPU processes on this machine). Taken from the stack output
    GpuInstanceType when the outputs file is read."""
    nodes: int = 2
    """Nodes (= pods, one per node). Default: the stack output GpuNodeCount when it is above 0, else 2."""
    procs_per_node: int | None = None
    """Training processes per pod. None: one per GPU (GPU profiles), 1 on local."""
    gpus_per_node: int | None = None
    """GPUs each pod requests. None: all of the instance's; other numbers are refused (one pod per node)."""
    efa_per_node: int | None = None
    """EFA devices each pod requests. None: all of the instance's; any other number is an error."""
    image: str = ""
    """Trainer image. Empty: <EcrRepositoryUri>:<image_tag> from the stack outputs. Required on EKS."""
    image_tag: str = "latest"
    """Tag appended to the ECR repository when `image` is empty (`make image` pushes this tag)."""
    image_pull_policy: PullPolicy = "IfNotPresent"
    """Kubernetes imagePullPolicy; use Always with a moving tag such as latest."""
    service_account: str = "kit-trainer"
    """Service account of the pods (created; no API token is mounted)."""

    # -- launcher --
    launcher: Launcher = "kit"
    """Process launcher in each pod: kit (heartbeat launcher), ft_launcher (NVRx) or torchrun (the study's
    baseline: static rendezvous, restarts left to Kubernetes)."""
    max_restarts: int | None = None
    """Worker-group restarts the launcher may spend. None: kit 10, ft_launcher 20, torchrun 0 (study)."""
    monitor_interval_s: float = 0.5
    """Seconds between the launcher's health checks of its workers."""
    heartbeat_timeout: str = "auto"
    """Seconds without a heartbeat before a rank counts as hung, or "auto" (the kit launcher learns it;
    ft_launcher then uses 900, the study's value)."""
    heartbeat_load_timeout_s: float = 1200.0
    """Heartbeat allowance, seconds, while a rank starts or loads a checkpoint (the study's 1,200)."""
    heartbeat_safety_factor: float | None = None
    """Multiplier on the longest observed step for "auto" timeouts. None: the launcher's default."""
    rdzv_port: int = 29500
    """Rendezvous port on pod 0; the next two ports are kept free for the trainer's and in-process stores."""

    # -- trainer (contract 4; None leaves the trainer's own default) --
    model: ModelName | None = None
    """Model: tiny, small or llama3.1-8b. None: the profile's (p5/p4d llama3.1-8b, g5 small, local tiny)."""
    data_kind: DataKind = "synthetic"
    """Training data: synthetic (no download, no token) or shards (pre-tokenized files at data_path)."""
    data_path: str = ""
    """Shards folder on FSx for data_kind=shards, e.g. /fsx/data/c4; outside /fsx/runs."""
    seq_len: int | None = None
    """Tokens per sample."""
    batch_size: int | None = None
    """Samples per rank per step."""
    steps: int | None = None
    """Total training steps."""
    log_every: int | None = None
    """Steps between log lines of rank 0."""
    seed: int | None = None
    """Run seed (data order and initial weights)."""
    deterministic: bool | None = None
    """Deterministic algorithms (bitwise-reproducible resumes on CPU)."""
    checkpoint_mode: CheckpointMode = "async"
    """Checkpointing: off, sync or async (staged through /dev/shm, written in the background)."""
    checkpoint_interval: int | None = None
    """Steps between checkpoints."""
    checkpoint_keep: int | None = None
    """Committed checkpoints kept (at least 2: the newest may still be in flight)."""
    checkpoint_backend: CheckpointBackend | None = None
    """Checkpoint writer: kit, dcp or nvrx."""
    fault_spec: str = ""
    """Injected faults, e.g. kill:step=20:rank=1,exception:step=45:rank=1 (kinds kill, hang, sigstop,
    exception, oom; step=N or time=SECONDS). Empty: none."""
    fault_schedule_seed: int | None = None
    """Seed of the study's random fault schedule (never rank 0). None: no schedule."""
    fault_schedule_count: int | None = None
    """Faults in the seeded schedule."""
    fault_schedule_kinds: str | None = None
    """Kinds and weights of scheduled faults, e.g. exception:0.6,hang:0.4."""
    fault_schedule_after_step: int | None = None
    """Scheduled faults fall strictly after this step."""
    inprocess: bool = False
    """In-process restart: ranks recover inside the running process before the launcher restarts them."""
    inprocess_backend: InprocessBackend | None = None
    """In-process restart implementation: kit or nvrx."""
    inprocess_max_restarts: int | None = None
    """In-process restarts before the launcher takes over."""
    inprocess_barrier_timeout_s: float | None = None
    """Seconds the in-process restart waits for all ranks; must stay below a numeric heartbeat_timeout."""
    train: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Other trainer config fields, set as TRAIN.<section>.<field>=<value> (e.g. TRAIN.optim.lr=1e-4)."""

    # -- pod --
    shm_gib: int | None = None
    """Size of the memory-backed /dev/shm, GiB. None: twice the per-node async checkpoint staging size,
    at least the profile's minimum. Counts against the pod's memory."""
    hugepages_2mi_mib: int = 0
    """2 MiB hugepages each pod requests, MiB (e.g. 5120 for EFA); 0: none. The nodes must have them."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra container env, ENV.<NAME>=<value>; overrides the profile's NCCL/libfabric settings. Names the
    launcher owns (MASTER_ADDR, RANK, WORLD_SIZE, ...) are refused. Never put secrets here."""
    nccl_debug: str = "WARN"
    """NCCL_DEBUG on GPU profiles (VERSION, WARN, INFO, TRACE)."""
    ttl_seconds_after_finished: int = 21600
    """Seconds a finished Job and its pods stay for inspection before Kubernetes deletes them."""
    backoff_limit_per_index: int = 3
    """Pod replacements per node index for failures that count (not node loss, not exit 78)."""
    active_deadline_s: int | None = None
    """Wall-clock limit of the whole Job, seconds. None: no limit."""
    termination_grace_s: int = 120
    """Seconds between SIGTERM and SIGKILL when a pod stops (lets the last async checkpoint drain)."""

    # -- cluster (from the stack outputs) --
    cluster_name: str = ""
    """EKS cluster name (stack output ClusterName)."""
    region: str = ""
    """AWS region (stack output Region)."""
    gpu_instance_type: str = ""
    """Instance type of the GPU node group (stack output GpuInstanceType); must match the profile."""
    gpu_node_count: int | None = None
    """Nodes in the GPU node group (stack output GpuNodeCount); the Job may not ask for more."""
    node_selector: dict[str, str] = field(default_factory=dict)
    """Node labels the pods require (stack output GpuNodeLabels). Empty on GPU profiles: the instance type."""
    gpu_node_taint: str = ""
    """Taint of the GPU nodes, key=value:Effect (stack output GpuNodeTaint); the pods tolerate it."""
    fsx_file_system_id: str = ""
    """FSx for Lustre file system id (stack output FsxFileSystemId)."""
    fsx_dns_name: str = ""
    """FSx DNS name (stack output FsxDnsName)."""
    fsx_mount_name: str = ""
    """FSx mount name (stack output FsxMountName)."""
    fsx_pvc: str = ""
    """An existing PVC for FSx (stack output FsxPvcName, when CDK creates it). Empty: the kit renders a PV and
    a PVC named kit-fsx in the namespace."""
    fsx_pvc_namespace: str = ""
    """Namespace of the FSX_PVC claim (stack output FsxPvcNamespace); the Job must run there."""
    fsx_storage_gib: int = 1200
    """Capacity written on the kit's FSx PV/PVC, GiB (informational for static provisioning)."""
    kubernetes_version: str = "1.35"
    """Kubernetes version of the cluster, for schema validation (stack output KubernetesVersion if any)."""

    def __post_init__(self) -> None:
        _check_fields(self)


# ------------------------------------------------------------------ parsing

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
        "FsxPvcName": "fsx_pvc",
        "FsxPvcNamespace": "fsx_pvc_namespace",
        "FsxStorageGiB": "fsx_storage_gib",
        "GpusPerNode": "gpus_per_node",
        "EfaDevicesPerNode": "efa_per_node",
        "KubernetesVersion": "kubernetes_version",
    }
)
"""Stack output key -> field. EcrRepositoryUri fills `image`; GpuInstanceType also picks the profile."""

_MAP_FIELDS = {"env": "ENV", "node_selector": "NODE_SELECTOR", "train": "TRAIN"}


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(JobValues)]


def _hints() -> dict[str, Any]:
    return typing.get_type_hints(JobValues)


def _key_label(name: str) -> str:
    return name.upper()


def parse_scalar(name: str, raw: str) -> Any:
    """Parse `raw` for field `name` by its type; ValuesError names the key and the expected form."""
    hint = _hints()[name]
    args = typing.get_args(hint)
    optional = type(None) in args
    if optional:
        hint = next(a for a in args if a is not type(None))
        if raw.strip().lower() in ("", "none", "null"):
            return None
    label = _key_label(name)
    origin = typing.get_origin(hint)
    if origin is Literal:
        choices = typing.get_args(hint)
        if raw not in choices:
            raise ValuesError(f"{label}={raw!r} is not one of {', '.join(choices)}")
        return raw
    if hint is bool:
        low = raw.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValuesError(f"{label}={raw!r} is not a boolean; use 1/0, true/false, yes/no or on/off")
    if hint is int:
        try:
            return int(raw)
        except ValueError:
            raise ValuesError(f"{label}={raw!r} is not a whole number") from None
    if hint is float:
        try:
            value = float(raw)
        except ValueError:
            raise ValuesError(f"{label}={raw!r} is not a number") from None
        if not math.isfinite(value):
            raise ValuesError(f"{label}={raw!r} is not a finite number")
        return value
    if hint is str:
        return raw
    raise ValuesError(f"{label} cannot be set from a string; see docs/k8s.md")  # maps go through KEY.sub=v


def _split_override(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ValuesError(f"override {item!r} is not KEY=VALUE; e.g. NODES=4 or ENV.NCCL_DEBUG=INFO")
    return key.strip(), value


def _field_for(key: str) -> str:
    name = key.replace("-", "_").lower()
    if name in field_names() and name not in _MAP_FIELDS:
        return name
    keys = [_key_label(n) for n in field_names() if n not in _MAP_FIELDS] + [
        f"{p}.<name>" for p in _MAP_FIELDS.values()
    ]
    close = difflib.get_close_matches(key.replace("-", "_").upper(), keys, n=1)
    hint = f"; did you mean {close[0]}?" if close else "; see docs/k8s.md for the keys"
    raise ValuesError(f"unknown value {key}{hint}")


def apply_overrides(base: dict[str, Any], overrides: list[str] | Mapping[str, str]) -> dict[str, Any]:
    """Return `base` (field -> value) updated by KEY=VALUE overrides, each parsed by its field's type."""
    items = (
        list(overrides.items()) if isinstance(overrides, Mapping) else [_split_override(o) for o in overrides]
    )
    merged = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for key, raw in items:
        prefix, dot, rest = key.partition(".")
        map_field = next((f for f, p in _MAP_FIELDS.items() if p == prefix.upper().replace("-", "_")), None)
        if dot and map_field is not None:
            _set_map_entry(merged, map_field, rest, raw)
        else:
            name = _field_for(key)
            merged[name] = parse_scalar(name, raw)
    return merged


def _yaml_scalar(raw: str) -> Any:
    """A TRAIN.* value as the trainer's YAML file would hold it: int, float, bool, or the string itself."""
    for convert in (int, float):
        try:
            return convert(raw)
        except ValueError:
            pass
    low = raw.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    return raw


def _set_map_entry(merged: dict[str, Any], map_field: str, sub: str, raw: str) -> None:
    label = _MAP_FIELDS[map_field]
    if map_field == "train":
        section, dot, name = sub.partition(".")
        if not dot or section not in TRAINER_FIELDS or not name.isidentifier():
            raise ValuesError(
                f"TRAIN.{sub} is not a trainer config field; sections: {', '.join(TRAINER_FIELDS)} "
                "(fields as in the trainer's config, e.g. TRAIN.optim.lr=1e-4)"
            )
        typed = TYPED_TRAINER_FIELDS.get((section, name))
        if typed is not None:
            raise ValuesError(f"TRAIN.{sub} has its own value; set {_key_label(typed)}={raw} instead")
        parsed = _yaml_scalar(raw)
        merged.setdefault("train", {}).setdefault(section, {})[name] = parsed
        return
    if not sub:
        raise ValuesError(f"{label}.<name>={raw} needs a name after the dot, e.g. {label}.NCCL_DEBUG=INFO")
    merged.setdefault(map_field, {})[sub] = raw


# (section, field) of the trainer config -> the JobValues field that sets it (run.root/id are the kit's).
TYPED_TRAINER_FIELDS: Mapping[tuple[str, str], str] = types.MappingProxyType(
    {
        ("run", "id"): "run_id",
        ("run", "root"): "run_id",
        ("run", "seed"): "seed",
        ("model", "name"): "model",
        ("data", "kind"): "data_kind",
        ("data", "path"): "data_path",
        ("data", "seq_len"): "seq_len",
        ("data", "batch_size"): "batch_size",
        ("training", "steps"): "steps",
        ("training", "log_every"): "log_every",
        ("training", "deterministic"): "deterministic",
        ("checkpoint", "mode"): "checkpoint_mode",
        ("checkpoint", "interval"): "checkpoint_interval",
        ("checkpoint", "keep"): "checkpoint_keep",
        ("checkpoint", "backend"): "checkpoint_backend",
        ("fault", "spec"): "fault_spec",
        ("fault", "schedule_seed"): "fault_schedule_seed",
        ("fault", "schedule_count"): "fault_schedule_count",
        ("fault", "schedule_kinds"): "fault_schedule_kinds",
        ("fault", "schedule_after_step"): "fault_schedule_after_step",
        ("inprocess", "enabled"): "inprocess",
        ("inprocess", "backend"): "inprocess_backend",
        ("inprocess", "max_restarts"): "inprocess_max_restarts",
        ("inprocess", "barrier_timeout_s"): "inprocess_barrier_timeout_s",
    }
)


def values_from_outputs(outputs: Mapping[str, Any]) -> dict[str, Any]:
    """Field values taken from merged stack outputs (see `k8s.outputs`); unknown keys are ignored."""
    found: dict[str, Any] = {}
    for key, name in OUTPUT_FIELDS.items():
        if key not in outputs:
            continue
        raw = outputs[key]
        if name == "node_selector":
            found[name] = _parse_labels(raw)
        elif name in ("gpu_node_count", "fsx_storage_gib", "gpus_per_node", "efa_per_node"):
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


def build_values(
    *,
    outputs: Mapping[str, Any] | None = None,
    overrides: list[str] | Mapping[str, str] = (),
    allow_placeholders: bool = False,
    now: datetime | None = None,
) -> JobValues:
    """Defaults, then stack outputs, then overrides; every rule checked. The one way to make JobValues."""
    layered: dict[str, Any] = {}
    if outputs is not None:
        layered.update(values_from_outputs(outputs))
    layered = apply_overrides(layered, overrides)
    ecr = layered.pop("_ecr_repository", "")
    if not layered.get("image") and ecr:
        layered["image"] = f"{ecr}:{layered.get('image_tag', 'latest')}"
    if outputs is None and allow_placeholders:
        for name, value in placeholders(layered.get("profile", "p5")).items():
            if not layered.get(name):
                layered[name] = value
    if not layered.get("run_id"):
        stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
        layered["run_id"] = f"kit-{stamp}"
    values = JobValues(**layered)
    check_rules(values, allow_placeholders=allow_placeholders)
    return values


# ------------------------------------------------------------------ rules


def _fail(key: str, value: Any, rule: str) -> typing.NoReturn:
    shown = value if isinstance(value, str) else json.dumps(value)
    raise ValuesError(f"{key}={shown}: {rule}")


def _check_fields(v: JobValues) -> None:
    """Rules about one field at a time (called from __post_init__)."""
    if not _DNS1035.match(v.run_id) or len(v.run_id) > RUN_ID_MAX:
        _fail(
            "RUN_ID",
            v.run_id,
            f"must be lower-case letters, digits and '-', start with a letter, end with a "
            f"letter or digit, at most {RUN_ID_MAX} characters (e.g. llama-4n-async)",
        )
    if not _DNS1123_LABEL.match(v.namespace) or len(v.namespace) > 63:
        _fail("NAMESPACE", v.namespace, "must be a DNS-1123 label (lower-case letters, digits, '-'; max 63)")
    if not _DNS1123_LABEL.match(v.service_account) or len(v.service_account) > 63:
        _fail("SERVICE_ACCOUNT", v.service_account, "must be a DNS-1123 label")
    if v.nodes < 1:
        _fail("NODES", v.nodes, "must be at least 1")
    for name in ("procs_per_node", "steps", "checkpoint_interval", "seq_len", "batch_size", "log_every"):
        value = getattr(v, name)
        if value is not None and value < 1:
            _fail(_key_label(name), value, "must be at least 1")
    if v.checkpoint_keep is not None and v.checkpoint_keep < 2:
        _fail("CHECKPOINT_KEEP", v.checkpoint_keep, "must be at least 2 (the newest may still be in flight)")
    if v.max_restarts is not None and v.max_restarts < 0:
        _fail("MAX_RESTARTS", v.max_restarts, "must be 0 or more")
    if v.monitor_interval_s <= 0:
        _fail("MONITOR_INTERVAL_S", v.monitor_interval_s, "must be above 0 seconds")
    if v.heartbeat_timeout != "auto":
        try:
            seconds = float(v.heartbeat_timeout)
        except ValueError:
            seconds = -1.0
        if not math.isfinite(seconds) or seconds <= 0:
            _fail("HEARTBEAT_TIMEOUT", v.heartbeat_timeout, "must be auto or a number of seconds above 0")
    if v.heartbeat_load_timeout_s <= 0:
        _fail("HEARTBEAT_LOAD_TIMEOUT_S", v.heartbeat_load_timeout_s, "must be above 0 seconds")
    if v.heartbeat_safety_factor is not None and v.heartbeat_safety_factor < 1:
        _fail("HEARTBEAT_SAFETY_FACTOR", v.heartbeat_safety_factor, "must be at least 1")
    if not 1024 <= v.rdzv_port <= 65533:
        _fail("RDZV_PORT", v.rdzv_port, "must be between 1024 and 65533 (the next two ports are used too)")
    for name in (
        "ttl_seconds_after_finished",
        "backoff_limit_per_index",
        "termination_grace_s",
        "hugepages_2mi_mib",
    ):
        if getattr(v, name) < 0:
            _fail(_key_label(name), getattr(v, name), "must be 0 or more")
    if v.hugepages_2mi_mib % 2:
        _fail("HUGEPAGES_2MI_MIB", v.hugepages_2mi_mib, "must be a multiple of 2 (2 MiB pages)")
    if v.active_deadline_s is not None and v.active_deadline_s < 1:
        _fail("ACTIVE_DEADLINE_S", v.active_deadline_s, "must be at least 1 second, or none")
    if v.shm_gib is not None and v.shm_gib < 1:
        _fail("SHM_GIB", v.shm_gib, "must be at least 1")
    if v.fsx_storage_gib < 1:
        _fail("FSX_STORAGE_GIB", v.fsx_storage_gib, "must be at least 1")
    if v.inprocess_barrier_timeout_s is not None and v.inprocess_barrier_timeout_s <= 0:
        _fail("INPROCESS_BARRIER_TIMEOUT_S", v.inprocess_barrier_timeout_s, "must be above 0 seconds")
    if v.inprocess_max_restarts is not None and v.inprocess_max_restarts < 0:
        _fail("INPROCESS_MAX_RESTARTS", v.inprocess_max_restarts, "must be 0 or more")
    if not re.fullmatch(r"\d+\.\d+", v.kubernetes_version):
        _fail("KUBERNETES_VERSION", v.kubernetes_version, "must be MAJOR.MINOR, e.g. 1.35")
    if v.nccl_debug.upper() not in ("VERSION", "WARN", "INFO", "TRACE"):
        _fail("NCCL_DEBUG", v.nccl_debug, "must be VERSION, WARN, INFO or TRACE")
    for name, value in v.env.items():
        _check_env_entry(name, value)
    for key, value in v.node_selector.items():
        if not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value) or len(value) > 63:
            _fail(f"NODE_SELECTOR.{key}", value, "is not a valid Kubernetes label key/value")
    if v.gpu_node_taint and not _TAINT.match(v.gpu_node_taint):
        _fail(
            "GPU_NODE_TAINT",
            v.gpu_node_taint,
            "must be key=value:Effect (NoSchedule, PreferNoSchedule, NoExecute)",
        )
    if v.fault_schedule_kinds is not None and not _KINDS.match(v.fault_schedule_kinds):
        _fail(
            "FAULT_SCHEDULE_KINDS",
            v.fault_schedule_kinds,
            "must be KIND:WEIGHT,... e.g. exception:0.6,hang:0.4",
        )
    if v.data_kind == "shards":
        if not v.data_path.startswith(FSX_MOUNT + "/"):
            _fail(
                "DATA_PATH", v.data_path or "''", f"must be a folder under {FSX_MOUNT}/ for data_kind=shards"
            )
        if (v.data_path + "/").startswith(RUNS_ROOT + "/"):
            _fail("DATA_PATH", v.data_path, f"must be outside {RUNS_ROOT}/ (run folders are never shared)")
    elif v.data_path:
        _fail(
            "DATA_PATH", v.data_path, "is only used with DATA_KIND=shards; remove it or set DATA_KIND=shards"
        )


def _check_env_entry(name: str, value: str) -> None:
    if not _ENV_NAME.match(name):
        _fail(f"ENV.{name}", value, "is not a valid environment variable name")
    if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
        _fail(f"ENV.{name}", value, "is set by the kit or the launcher from the other values; remove it")
    if looks_secret(name, value):
        _fail(f"ENV.{name}", "<redacted>", "looks like a secret; mount it from a Kubernetes Secret instead")


_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|ACCESS_KEY|API_KEY|PRIVATE_KEY|CREDENTIAL)", re.I)
_SECRET_VALUE = re.compile(
    r"(AKIA|ASIA)[0-9A-Z]{16}|hf_[A-Za-z0-9]{20,}|-----BEGIN [A-Z ]*PRIVATE KEY|ghp_[A-Za-z0-9]{30,}"
)


def looks_secret(name: str, value: str) -> bool:
    """True for a literal value that is, or is named like, a credential (shared with the policy checks)."""
    return bool(value and (_SECRET_NAME.search(name) or _SECRET_VALUE.search(value)))


def world_size(v: JobValues) -> int:
    return v.nodes * procs_per_node(v)


def procs_per_node(v: JobValues) -> int:
    profile = get_profile(v.profile)
    return v.procs_per_node if v.procs_per_node is not None else max(profile.gpus, 1)


def max_restarts(v: JobValues) -> int:
    return v.max_restarts if v.max_restarts is not None else LAUNCHER_DEFAULT_RESTARTS[v.launcher]


def staging_gib(v: JobValues) -> float:
    """Bytes one node stages per async checkpoint, GiB: the model's checkpoint split over the nodes."""
    model = v.model or get_profile(v.profile).default_model
    return MODEL_PARAMS[model] * CKPT_BYTES_PER_PARAM / v.nodes / 2**30


def shm_gib(v: JobValues) -> int:
    """/dev/shm size: the explicit value, else twice the staging size, at least the profile's minimum."""
    if v.shm_gib is not None:
        return v.shm_gib
    return max(get_profile(v.profile).shm_min_gib, math.ceil(2 * staging_gib(v)))


def heartbeat_seconds(v: JobValues) -> float | None:
    """The numeric heartbeat timeout the launcher gets (ft_launcher's "auto" is the study's 900 s)."""
    if v.heartbeat_timeout != "auto":
        return float(v.heartbeat_timeout)
    return FT_AUTO_HEARTBEAT_S if v.launcher == "ft_launcher" else None


def parse_faults(spec: str) -> list[dict[str, Any]]:
    """Parse a fault spec just enough to check it against the job's shape (the trainer owns the semantics)."""
    faults = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        m = _FAULT.match(part)
        if not m:
            _fail(
                "FAULT_SPEC",
                spec,
                f"{part!r} is not KIND:step=N:rank=R or KIND:time=SECONDS:rank=R "
                "(KIND kill, hang, sigstop, exception or oom)",
            )
        faults.append({"kind": m["kind"], m["when"]: float(m["at"]), "rank": int(m["rank"])})
    return faults


def check_rules(v: JobValues, *, allow_placeholders: bool = False) -> None:
    """Rules across fields, the hardware and the stack outputs (the study's timeout invariants included)."""
    profile = get_profile(v.profile)
    if v.gpu_instance_type and profile.requires_image and v.gpu_instance_type not in profile.instance_family:
        _fail(
            "PROFILE",
            v.profile,
            f"expects {profile.instance_type} but the GPU node group runs "
            f"{v.gpu_instance_type}; set PROFILE to match it",
        )
    if v.gpus_per_node is not None and v.gpus_per_node != profile.gpus:
        _fail(
            "GPUS_PER_NODE",
            v.gpus_per_node,
            f"{profile.instance_type} has {profile.gpus} GPUs and the kit "
            f"runs one pod per node; remove GPUS_PER_NODE or pick another PROFILE",
        )
    if v.efa_per_node is not None and v.efa_per_node != profile.efa:
        _fail(
            "EFA_PER_NODE",
            v.efa_per_node,
            f"{profile.instance_type} has {profile.efa} EFA devices; "
            "remove EFA_PER_NODE or pick another PROFILE",
        )
    if profile.gpus and v.procs_per_node is not None and v.procs_per_node != profile.gpus:
        _fail(
            "PROCS_PER_NODE",
            v.procs_per_node,
            f"must equal the {profile.gpus} GPUs of {profile.instance_type} (one rank per GPU)",
        )
    if v.gpu_node_count and profile.requires_image and v.nodes > v.gpu_node_count:
        _fail(
            "NODES",
            v.nodes,
            f"the GPU node group has {v.gpu_node_count} nodes; ask for at most that many "
            "or scale the node group",
        )
    if profile.requires_image:
        if not v.image:
            _fail(
                "IMAGE",
                "''",
                "an EKS profile needs the trainer image; pass OUTPUTS=cdk-outputs.json "
                "(EcrRepositoryUri) or IMAGE=<uri:tag> (make image builds it)",
            )
        if not allow_placeholders:
            for name in ("image", "fsx_file_system_id", "fsx_dns_name", "fsx_mount_name", "cluster_name"):
                value = getattr(v, name)
                if PLACEHOLDER in value:
                    _fail(
                        _key_label(name), value, "is a dry-run placeholder; deploy first or set it explicitly"
                    )
            if not v.fsx_pvc and not (v.fsx_file_system_id and v.fsx_dns_name and v.fsx_mount_name):
                _fail(
                    "FSX_FILE_SYSTEM_ID",
                    v.fsx_file_system_id or "''",
                    "the FSx volume needs the stack outputs "
                    "FsxFileSystemId, FsxDnsName and FsxMountName (or FSX_PVC=<existing claim>)",
                )
    if v.fsx_pvc and v.fsx_pvc_namespace and v.namespace != v.fsx_pvc_namespace:
        _fail(
            "NAMESPACE",
            v.namespace,
            f"the FSx claim {v.fsx_pvc} lives in namespace {v.fsx_pvc_namespace}; "
            f"use NAMESPACE={v.fsx_pvc_namespace} (a pod can mount only claims of its own namespace)",
        )
    ws = world_size(v)
    for fault in parse_faults(v.fault_spec):
        if fault["rank"] >= ws:
            _fail(
                "FAULT_SPEC",
                v.fault_spec,
                f"rank={fault['rank']} does not exist: the world size is {ws} "
                f"({v.nodes} nodes x {procs_per_node(v)} processes)",
            )
        if "step" in fault and v.steps is not None and fault["step"] > v.steps:
            _fail("FAULT_SPEC", v.fault_spec, f"step={int(fault['step'])} is after the last step ({v.steps})")
    if v.fault_schedule_seed is not None and ws < 2:
        _fail(
            "FAULT_SCHEDULE_SEED",
            v.fault_schedule_seed,
            "the schedule never faults rank 0, so it needs a world size of 2 or more",
        )
    if v.checkpoint_interval is not None and v.steps is not None and v.checkpoint_interval > v.steps:
        _fail(
            "CHECKPOINT_INTERVAL",
            v.checkpoint_interval,
            f"is beyond the last step ({v.steps}); no checkpoint would be written",
        )
    if v.checkpoint_mode == "off" and v.checkpoint_interval is not None:
        _fail(
            "CHECKPOINT_INTERVAL", v.checkpoint_interval, "is set but CHECKPOINT_MODE=off; remove one of them"
        )
    _check_timeouts(v)
    shm = shm_gib(v)
    memory = profile.memory_gib
    if shm > memory // 2:
        _fail("SHM_GIB", shm, f"is more than half the pod's {memory} GiB memory (the shm counts against it)")
    if v.checkpoint_mode == "async" and shm < staging_gib(v):
        _fail(
            "SHM_GIB",
            shm,
            f"is below the {staging_gib(v):.1f} GiB one node stages per async checkpoint; "
            "raise SHM_GIB or use more NODES",
        )
    if v.hugepages_2mi_mib and profile.name == "local":
        _fail(
            "HUGEPAGES_2MI_MIB",
            v.hugepages_2mi_mib,
            "hugepages are for EFA nodes; remove it on PROFILE=local",
        )
    user_env = {**profile.env, **v.env}
    if v.inprocess and user_env.get("TORCH_NCCL_RETHROW_CUDA_ERRORS", "0") != "0":
        _fail(
            "ENV.TORCH_NCCL_RETHROW_CUDA_ERRORS",
            user_env["TORCH_NCCL_RETHROW_CUDA_ERRORS"],
            "must be 0 with INPROCESS=1 (NVRx in-process guide); remove it",
        )
    if user_env.get("NCCL_NVLS_ENABLE", "0") != "0":
        _fail(
            "ENV.NCCL_NVLS_ENABLE",
            user_env["NCCL_NVLS_ENABLE"],
            "must stay 0 (NVLS breaks restarts); remove it",
        )


def _check_timeouts(v: JobValues) -> None:
    """Timeout invariants (reference/seed-system.md section 14.6), checked before anything runs."""
    hb = heartbeat_seconds(v)
    if hb is not None:
        if hb <= 2 * v.monitor_interval_s:
            _fail(
                "HEARTBEAT_TIMEOUT",
                v.heartbeat_timeout,
                f"must be above twice MONITOR_INTERVAL_S "
                f"({v.monitor_interval_s}) or no beat can be seen in time",
            )
        if v.heartbeat_load_timeout_s < hb:
            _fail(
                "HEARTBEAT_LOAD_TIMEOUT_S",
                v.heartbeat_load_timeout_s,
                f"must be at least HEARTBEAT_TIMEOUT "
                f"({hb:g}): starting and loading a checkpoint take longer than a step",
            )
        if v.inprocess and v.inprocess_barrier_timeout_s is not None and v.inprocess_barrier_timeout_s >= hb:
            _fail(
                "INPROCESS_BARRIER_TIMEOUT_S",
                v.inprocess_barrier_timeout_s,
                f"must be below HEARTBEAT_TIMEOUT "
                f"({hb:g}) so an in-process restart finishes before the launcher declares a hang",
            )
    if v.launcher == "torchrun" and v.inprocess and max_restarts(v) > 0:
        _fail(
            "MAX_RESTARTS",
            max_restarts(v),
            "torchrun kills every worker when one dies, so in-process restart "
            "cannot work under its restarts (NVRx guide); use MAX_RESTARTS=0 or LAUNCHER=kit",
        )
    if v.launcher != "kit" and v.heartbeat_safety_factor is not None:
        _fail(
            "HEARTBEAT_SAFETY_FACTOR",
            v.heartbeat_safety_factor,
            f"is a kit-launcher flag; remove it for LAUNCHER={v.launcher}",
        )
    if v.launcher == "torchrun" and v.heartbeat_timeout != "auto":
        _fail(
            "HEARTBEAT_TIMEOUT",
            v.heartbeat_timeout,
            "torchrun has no heartbeat; remove it or use LAUNCHER=kit",
        )
