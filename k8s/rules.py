"""Rules over typed JobValues: one field at a time (`check_fields`), then across fields, the hardware and
the stack outputs (`check_rules`); `advice` lists what is allowed but probably a mistake. Each of the two is
a tuple of small named checks applied in order, so a rule is found by name and the first broken one wins.

Every broken rule raises `ValuesError` with one line: the key, the value seen, the rule and the fix.
Kubernetes naming rules come from `fsdpkit.k8s.names`, derived numbers from `fsdpkit.k8s.derived`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import typing
from typing import Any

from fsdpkit.contracts.cliargs import parse_float
from fsdpkit.k8s import elastic, names, security
from fsdpkit.k8s.derived import (
    TIER_COPIES,
    grace_needed_s,
    heartbeat_seconds,
    max_restarts,
    procs_per_node,
    shm_gib,
    staging_gib,
    tier_gib,
    tier_keep,
    tiers,
    world_size,
)
from fsdpkit.k8s.entrypoint import IMAGE_TAG, image_problem, parse_entrypoint, shown
from fsdpkit.k8s.model import (
    FSX_MOUNT,
    KEEP_ALIVE_ATTEMPTS_MAX,
    KEEP_ALIVE_S_RANGE,
    KEEP_ALIVE_STALL_MIN_S,
    PLACEHOLDER,
    RDZV_TIMEOUT_MAX_S,
    RESERVED_ENV,
    RESERVED_ENV_PREFIXES,
    RUN_ID_MAX,
    RUNS_ROOT,
    JobValues,
    ValuesError,
)
from fsdpkit.k8s.overrides import key_label as _key_label
from fsdpkit.k8s.profiles import Profile, get_profile
from fsdpkit.k8s.versions import version_problem

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TAINT = re.compile(
    r"^(?P<key>[^=:\s]+)(=(?P<value>[^:\s]*))?:(?P<effect>NoSchedule|PreferNoSchedule|NoExecute)$"
)
_FAULT = re.compile(
    r"^(?P<kind>kill|hang|sigstop|exception|oom):(?P<when>step|time)=(?P<at>[0-9.]+):rank=(?P<rank>\d+)$"
    r"|^(?P<skind>slow):(?P<swhen>step|time)=(?P<sat>[0-9.]+):rank=(?P<srank>\d+):factor=[0-9.]+$"
    r"|^(?P<nkind>node|freeze|drain):(?P<nwhen>step|time)=(?P<nat>[0-9.]+):node=(?P<node>\d+)$"
)
_KINDS = re.compile(
    r"^(kill|hang|sigstop|exception|oom):[0-9.]+(,(kill|hang|sigstop|exception|oom):[0-9.]+)*$"
)
UNCHECKED_NODES_MAX = 64
"""Without stack outputs nobody knows the node group's size; above this many nodes (512 H100s on p5, a
larger gang than one Capacity Block or a typical p5 quota gives) `advice` warns. With outputs the node
group's GpuNodeCount is the hard bound instead."""


def _fail(key: str, value: Any, rule: str) -> typing.NoReturn:
    shown = value if isinstance(value, str) else json.dumps(value)
    raise ValuesError(f"{key}={shown}: {rule}")


def _check_keep_alive(v: JobValues) -> None:
    """The kit launcher's rule (training/launcher/cli.py `keep_alive_problem`; k8s does not import the
    trainer)."""
    lo, hi = KEEP_ALIVE_S_RANGE
    if not lo <= v.rdzv_keep_alive_s <= hi:
        _fail(
            "RDZV_KEEP_ALIVE_S",
            v.rdzv_keep_alive_s,
            f"must be between {lo:g} and {hi:g} seconds (faster beats of many nodes swamp the store)",
        )
    if not 2 <= v.rdzv_keep_alive_attempts <= KEEP_ALIVE_ATTEMPTS_MAX:
        _fail(
            "RDZV_KEEP_ALIVE_ATTEMPTS",
            v.rdzv_keep_alive_attempts,
            f"must be between 2 and {KEEP_ALIVE_ATTEMPTS_MAX}",
        )
    if (v.rdzv_keep_alive_attempts - 1) * v.rdzv_keep_alive_s < KEEP_ALIVE_STALL_MIN_S:
        _fail(
            "RDZV_KEEP_ALIVE_ATTEMPTS",
            v.rdzv_keep_alive_attempts,
            f"(RDZV_KEEP_ALIVE_ATTEMPTS - 1) x RDZV_KEEP_ALIVE_S ({v.rdzv_keep_alive_s:g}) must be at least "
            f"{KEEP_ALIVE_STALL_MIN_S:g} s, or a live node whose keep-alive stalls that long (a busy node, a "
            f"slow store) is dropped and the group restarts (e.g. 0.1 x 12)",
        )


def _check_run_id(v: JobValues) -> None:
    """RUN_ID names the Job, its Service and its run folder."""
    if names.dns1035_label(v.run_id) or len(v.run_id) > RUN_ID_MAX:  # it names the Service too
        _fail(
            "RUN_ID",
            v.run_id,
            f"must be lower-case letters, digits and '-', start with a letter, end with a "
            f"letter or digit, at most {RUN_ID_MAX} characters (e.g. llama-4n-async)",
        )


def _check_gang(v: JobValues) -> None:
    """A gang trains on one node or more; hot spares are optional."""
    if v.nodes < 1:
        _fail("NODES", v.nodes, "must be at least 1")
    if v.spares < 0:
        _fail("SPARES", v.spares, "must be 0 or more")


def _check_replacement_wait(v: JobValues) -> None:
    """The wait for the group to re-form is the rendezvous join timeout, within the kit launcher's bounds."""
    if not 1 <= v.replacement_wait_s <= RDZV_TIMEOUT_MAX_S:
        _fail("REPLACEMENT_WAIT_S", v.replacement_wait_s, f"must be 1 to {RDZV_TIMEOUT_MAX_S} seconds")


def _check_node_failures(v: JobValues) -> None:
    """How many failures of a node, within which window, give it up."""
    if v.node_failure_limit is not None and v.node_failure_limit < 0:
        _fail("NODE_FAILURE_LIMIT", v.node_failure_limit, "must be 0 (never give a node up) or more")
    if v.node_failure_window_s < 1:
        _fail("NODE_FAILURE_WINDOW_S", v.node_failure_window_s, "must be at least 1 second")


def _check_training_numbers(v: JobValues) -> None:
    """Sizes, counts and budgets of the training run and its checkpoints."""
    if not v.checkpoint_write_mib_s > 0:
        _fail("CHECKPOINT_WRITE_MIB_S", v.checkpoint_write_mib_s, "must be above 0 MiB/s")
    for name in ("procs_per_node", "steps", "checkpoint_interval", "seq_len", "batch_size", "log_every"):
        value = getattr(v, name)
        if value is not None and value != "auto" and value < 1:
            _fail(_key_label(name), value, "must be at least 1")
    if v.checkpoint_keep is not None and v.checkpoint_keep < 2:
        _fail("CHECKPOINT_KEEP", v.checkpoint_keep, "must be at least 2 (the newest may still be in flight)")
    if v.max_restarts is not None and v.max_restarts < 0:
        _fail("MAX_RESTARTS", v.max_restarts, "must be 0 or more")


def _check_heartbeat(v: JobValues) -> None:
    """The launcher's monitor and heartbeat timings, one at a time (`_check_timeouts` relates them)."""
    if v.monitor_interval_s <= 0:
        _fail("MONITOR_INTERVAL_S", v.monitor_interval_s, "must be above 0 seconds")
    if v.heartbeat_timeout != "auto":
        try:
            parse_float(v.heartbeat_timeout, "HEARTBEAT_TIMEOUT", lo=0, lo_open=True)
        except ValueError:
            _fail("HEARTBEAT_TIMEOUT", v.heartbeat_timeout, "must be auto or a number of seconds above 0")
    if v.heartbeat_load_timeout_s <= 0:
        _fail("HEARTBEAT_LOAD_TIMEOUT_S", v.heartbeat_load_timeout_s, "must be above 0 seconds")
    if v.heartbeat_safety_factor is not None and v.heartbeat_safety_factor < 1:
        _fail("HEARTBEAT_SAFETY_FACTOR", v.heartbeat_safety_factor, "must be at least 1")


def _check_rdzv_port(v: JobValues) -> None:
    """The rendezvous port and the two above it are the job's; none may be privileged or past 65535."""
    if not 1024 <= v.rdzv_port <= 65533:
        _fail("RDZV_PORT", v.rdzv_port, "must be between 1024 and 65533 (the next two ports are used too)")


def _check_pod_numbers(v: JobValues) -> None:
    """What the Job and its pods are given: lifetimes, retries, memory and storage."""
    for name in (
        "ttl_seconds_after_finished",
        "backoff_limit_per_index",
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


def _check_inprocess(v: JobValues) -> None:
    """In-process restart's barrier timeout and restart budget."""
    if v.inprocess_barrier_timeout_s is not None and v.inprocess_barrier_timeout_s <= 0:
        _fail("INPROCESS_BARRIER_TIMEOUT_S", v.inprocess_barrier_timeout_s, "must be above 0 seconds")
    if v.inprocess_max_restarts is not None and v.inprocess_max_restarts < 0:
        _fail("INPROCESS_MAX_RESTARTS", v.inprocess_max_restarts, "must be 0 or more")


def _check_kubernetes_version(v: JobValues) -> None:
    """The manifests need Job features and schemas of the versions `fsdpkit.k8s.versions` supports."""
    if problem := version_problem(v.kubernetes_version):
        _fail("KUBERNETES_VERSION", v.kubernetes_version, problem)


def _check_nccl_debug(v: JobValues) -> None:
    """NCCL_DEBUG is one of NCCL's log levels."""
    if v.nccl_debug.upper() not in ("VERSION", "WARN", "INFO", "TRACE"):
        _fail("NCCL_DEBUG", v.nccl_debug, "must be VERSION, WARN, INFO or TRACE")


def _check_env(v: JobValues) -> None:
    """Each ENV entry (`_check_env_entry`)."""
    for name, value in v.env.items():
        _check_env_entry(name, value)


def _check_node_selector(v: JobValues) -> None:
    """NODE_SELECTOR entries are Kubernetes label keys and values."""
    for key, value in v.node_selector.items():
        if problem := names.qualified_name(key):
            _fail(f"NODE_SELECTOR.{key}", value, f"the label key {problem}")
        if problem := names.label_value(value):
            _fail(f"NODE_SELECTOR.{key}", value, f"the label value {problem}")


def _check_gpu_node_taint(v: JobValues) -> None:
    """The pods tolerate GPU_NODE_TAINT, so it must be a taint."""
    if v.gpu_node_taint and not _TAINT.match(v.gpu_node_taint):
        _fail(
            "GPU_NODE_TAINT",
            v.gpu_node_taint,
            "must be key=value:Effect (NoSchedule, PreferNoSchedule, NoExecute)",
        )


def _check_fault_schedule_kinds(v: JobValues) -> None:
    """The fault schedule's weighted kinds, in the trainer's syntax."""
    if v.fault_schedule_kinds is not None and not _KINDS.match(v.fault_schedule_kinds):
        _fail(
            "FAULT_SCHEDULE_KINDS",
            v.fault_schedule_kinds,
            "must be KIND:WEIGHT,... e.g. exception:0.6,hang:0.4",
        )


def _check_data_path(v: JobValues) -> None:
    """Shards live on FSx, outside the run folders; other data kinds read no path."""
    if v.data_kind == "shards":
        if not v.data_path.startswith(FSX_MOUNT + "/"):
            _fail(
                "DATA_PATH", v.data_path or "''", f"must be a folder under {FSX_MOUNT}/ for data_kind=shards"
            )
        if (v.data_path + "/").startswith(RUNS_ROOT + "/"):
            _fail("DATA_PATH", v.data_path, f"must be outside {RUNS_ROOT}/ (run folders are never shared)")
        inputs = [f"{FSX_MOUNT}/{f}/" for f in security.INPUT_FOLDERS]
        if security.on_cluster(v) and not any(v.data_path.startswith(i) for i in inputs):
            _fail(
                "DATA_PATH", v.data_path,
                f"must be under one of {', '.join(inputs)}: the pods mount only those (read-only) and their "
                "own run folder",
            )  # fmt: skip
    elif v.data_path:
        _fail(
            "DATA_PATH", v.data_path, "is only used with DATA_KIND=shards; remove it or set DATA_KIND=shards"
        )


def _check_image(v: JobValues) -> None:
    if v.image and (problem := image_problem(v.image)):
        _fail("IMAGE", shown(v.image), problem)
    if not IMAGE_TAG.fullmatch(v.image_tag):
        _fail(
            "IMAGE_TAG",
            shown(v.image_tag) or "''",
            "a Docker tag is letters, digits, '_', '.', '-' (at most 128, not starting with '.' or '-')",
        )


# Values only the kit's trainer reads (model, data, optim sections): (field, what a user's script chooses).
_KIT_TRAINER_VALUES: tuple[tuple[str, str], ...] = (
    ("model", "its model"),
    ("data_kind", "its data"),
    ("data_path", "its data"),
    ("seq_len", "its data"),
    ("batch_size", "its data"),
)
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(JobValues)}
_KIT_TRAINER_SECTIONS = {"model": "its model", "data": "its data", "optim": "its optimizer"}


def _check_entrypoint(v: JobValues) -> None:
    """ENTRYPOINT's own rules (`fsdpkit.k8s.entrypoint`), then the kit trainer's values it leaves without a
    reader."""
    if parse_entrypoint(v.entrypoint) is None:
        return
    fix = "drop it, or drop ENTRYPOINT to train with the kit's trainer"
    for name, what in _KIT_TRAINER_VALUES:
        value = getattr(v, name)
        if value != _DEFAULTS[name]:
            _fail(
                _key_label(name),
                value,
                f"is the kit trainer's; with ENTRYPOINT your script chooses {what}: {fix}",
            )
    for section, what in _KIT_TRAINER_SECTIONS.items():
        for name, value in v.train.get(section, {}).items():
            _fail(
                f"TRAIN.{section}.{name}",
                value,
                f"is the kit trainer's; with ENTRYPOINT your script chooses {what}: {fix}",
            )


# (field, rule, what the name becomes): every user-chosen name that lands in a manifest.
_NAME_RULES: tuple[tuple[str, typing.Callable[[str], str | None], str], ...] = (
    ("namespace", names.dns1123_label, "the namespace"),
    ("service_account", names.dns1123_subdomain, "the ServiceAccount name"),
    ("fsx_pvc", names.dns1123_subdomain, "the PVC name"),
    ("fsx_pvc_namespace", names.dns1123_label, "the claim's namespace"),
    ("priority_class", names.dns1123_subdomain, "a PriorityClass name"),
)


def _check_names(v: JobValues) -> None:
    """Names, by the Kubernetes rule of the object they name (empty optional names are left out)."""
    for name, rule, what in _NAME_RULES:
        value = getattr(v, name)
        if (name == "namespace" or value) and (problem := rule(value)):
            _fail(_key_label(name), value or "''", f"{what} {problem}")
    if v.kueue_queue:
        # The queue name is a label value on the Job and names a LocalQueue object: both rules apply.
        problem = names.label_value(v.kueue_queue) or names.dns1123_subdomain(v.kueue_queue)
        if problem:
            what = "the Kueue queue name (a label value and a LocalQueue name)"
            _fail("KUEUE_QUEUE", v.kueue_queue, f"{what} {problem}")


def _check_env_entry(name: str, value: str) -> None:
    if not _ENV_NAME.match(name):
        _fail(f"ENV.{name}", value, "is not a valid environment variable name")
    if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
        _fail(f"ENV.{name}", value, "is set by the kit or the launcher from the other values; remove it")
    if looks_secret(name, value):
        _fail(f"ENV.{name}", "<redacted>", "looks like a secret; mount it from a Kubernetes Secret instead")


_FieldCheck = typing.Callable[[JobValues], None]

_FIELD_CHECKS: tuple[_FieldCheck, ...] = (
    _check_run_id,
    _check_names,
    _check_image,
    _check_entrypoint,
    _check_gang,
    elastic.check_fields,
    _check_replacement_wait,
    _check_keep_alive,
    _check_node_failures,
    _check_training_numbers,
    _check_heartbeat,
    _check_rdzv_port,
    _check_pod_numbers,
    _check_inprocess,
    _check_kubernetes_version,
    _check_nccl_debug,
    _check_env,
    _check_node_selector,
    _check_gpu_node_taint,
    _check_fault_schedule_kinds,
    _check_data_path,
)
"""Rules about one field at a time, in the order `check_fields` applies them (the first broken one raises)."""


def check_fields(v: JobValues) -> None:
    """Rules about one field at a time (`_FIELD_CHECKS`), before any rule across fields reads them."""
    for check in _FIELD_CHECKS:
        check(v)


_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|ACCESS_KEY|API_KEY|PRIVATE_KEY|CREDENTIAL)", re.I)
_SECRET_VALUE = re.compile(
    r"(AKIA|ASIA)[0-9A-Z]{16}|hf_[A-Za-z0-9]{20,}|-----BEGIN [A-Z ]*PRIVATE KEY|ghp_[A-Za-z0-9]{30,}"
)


def looks_secret(name: str, value: str) -> bool:
    """True for a literal value that is, or is named like, a credential (shared with the policy checks). A
    `*_FILE` name with an absolute path names where a mounted secret is (KIT_RUN_TOKEN_FILE), not one."""
    if name.endswith("_FILE") and value.startswith("/") and not contains_credential(value):
        return False
    return bool(value and (_SECRET_NAME.search(name) or contains_credential(value)))


def contains_credential(text: str) -> bool:
    """True when `text` holds something shaped like an AWS, Hugging Face or GitHub key, or a private key."""
    return bool(_SECRET_VALUE.search(text))


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
                "(KIND kill, hang, sigstop, exception or oom), slow:step=N:rank=R:factor=F, "
                "nor node|freeze|drain:step=N:node=K",
            )
        if m["skind"]:
            faults.append({"kind": "slow", m["swhen"]: float(m["sat"]), "rank": int(m["srank"])})
        elif m["nkind"]:
            faults.append({"kind": m["nkind"], m["nwhen"]: float(m["nat"]), "node": int(m["node"])})
        else:
            faults.append({"kind": m["kind"], m["when"]: float(m["at"]), "rank": int(m["rank"])})
    return faults


@dataclasses.dataclass(frozen=True)
class _Given:
    """What the rules across fields read besides the values."""

    profile: Profile
    """The values' PROFILE: the node's hardware and the env every pod gets."""
    allow_placeholders: bool
    """A dry run's placeholders may stand in for the stack outputs."""


def _check_profile_instance(v: JobValues, given: _Given) -> None:
    """PROFILE describes the instance type the GPU node group runs."""
    profile = given.profile
    if v.gpu_instance_type and profile.requires_image and v.gpu_instance_type not in profile.instance_family:
        _fail(
            "PROFILE",
            v.profile,
            f"expects {profile.instance_type} but the GPU node group runs "
            f"{v.gpu_instance_type}; set PROFILE to match it",
        )


def _check_per_node_counts(v: JobValues, given: _Given) -> None:
    """One pod per node takes all of its GPUs and EFA devices, with one rank per GPU."""
    profile = given.profile
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


def _check_node_group_size(v: JobValues, given: _Given) -> None:
    """NODES fits the GPU node group (its max size, else its current size) when the outputs give one."""
    bound = v.gpu_max_nodes or v.gpu_node_count
    if bound and given.profile.requires_image and v.nodes > bound:
        what = "may scale to" if v.gpu_max_nodes else "has"
        _fail(
            "NODES",
            v.nodes,
            f"the GPU node group {what} {bound} nodes; ask for at most that many or raise gpu.max_nodes "
            "and redeploy",
        )


def _check_stack_outputs(v: JobValues, given: _Given) -> None:
    """An EKS job needs the trainer image and the FSx volume, and real values where a dry run fills in
    placeholders."""
    if not given.profile.requires_image:
        return
    if not v.image:
        _fail(
            "IMAGE",
            "''",
            "an EKS profile needs the trainer image; pass OUTPUTS=cdk-outputs.json "
            "(EcrRepositoryUri) or IMAGE=<uri:tag> (make image builds it)",
        )
    if given.allow_placeholders:
        return
    for name in ("image", "fsx_file_system_id", "fsx_dns_name", "fsx_mount_name", "cluster_name"):
        value = getattr(v, name)
        if PLACEHOLDER in value:
            _fail(_key_label(name), value, "is a dry-run placeholder; deploy first or set it explicitly")
    if not v.fsx_pvc and not (v.fsx_file_system_id and v.fsx_dns_name and v.fsx_mount_name):
        _fail(
            "FSX_FILE_SYSTEM_ID",
            v.fsx_file_system_id or "''",
            "the FSx volume needs the stack outputs "
            "FsxFileSystemId, FsxDnsName and FsxMountName (or FSX_PVC=<existing claim>)",
        )


def _check_claim_namespace(v: JobValues, given: _Given) -> None:
    """A pod can mount only claims of its own namespace."""
    if v.fsx_pvc and v.fsx_pvc_namespace and v.namespace != v.fsx_pvc_namespace:
        _fail(
            "NAMESPACE",
            v.namespace,
            f"the FSx claim {v.fsx_pvc} lives in namespace {v.fsx_pvc_namespace}; "
            f"use NAMESPACE={v.fsx_pvc_namespace} (a pod can mount only claims of its own namespace)",
        )


def _check_elastic(v: JobValues, given: _Given) -> None:
    """Elastic node counts against the global batch (`fsdpkit.k8s.elastic`); an elastic HSDP job keeps its
    shard group and changes its replicas, so it cannot fix the replica count."""
    elastic.check_rules(v)
    replicate = v.train.get("parallel", {}).get("replicate")
    if elastic.is_elastic(v) and replicate not in (None, 1, "1", "auto"):
        _fail(
            "TRAIN.parallel.replicate", replicate,
            "cannot be fixed in an elastic job (its world size changes): set TRAIN.parallel.replicate=auto "
            "with TRAIN.parallel.shard=N (a node loses or gains whole replicas)",
        )  # fmt: skip


def _check_spares_launcher(v: JobValues, given: _Given) -> None:
    """Only the kit launcher keeps hot spares."""
    if v.spares and v.launcher != "kit":
        _fail(
            "SPARES",
            v.spares,
            f"hot spares need LAUNCHER=kit ({v.launcher} is a baseline and keeps its own set-up); "
            "use SPARES=0 or LAUNCHER=kit",
        )


def _check_cordon_version(v: JobValues, given: _Given) -> None:
    """The node agent's grant is narrowed by a ValidatingAdmissionPolicy on the token's node-name claim."""
    minimum = security.CORDON_MIN_VERSION
    if security.cordon_allowed(v) and tuple(int(x) for x in v.kubernetes_version.split(".")) < minimum:
        _fail(
            "STRAGGLER_POLICY", v.straggler_policy,
            f"with SPARES cordons a node, which needs Kubernetes {minimum[0]}.{minimum[1]} or newer "
            f"(KUBERNETES_VERSION={v.kubernetes_version}: no ValidatingAdmissionPolicy v1 or node-name claim "
            "to keep the grant to the pod's own node); use STRAGGLER_POLICY=report or a newer cluster",
        )  # fmt: skip


def _check_termination_grace(v: JobValues, given: _Given) -> None:
    """The grace period lets a leaving pod finish a save in flight and write one more checkpoint.

    With ENTRYPOINT the checkpoint's size is the script's: the kit sizes /dev/shm and the grace period as
    for the profile's default model and leaves SHM_GIB and TERMINATION_GRACE_S to the user, unchecked."""
    needed = grace_needed_s(v)
    if v.termination_grace_s is not None and v.termination_grace_s < needed and not v.entrypoint:
        _fail(
            "TERMINATION_GRACE_S",
            v.termination_grace_s,
            f"is too short to drain: the job must finish a save in flight and write one more checkpoint "
            f"({staging_gib(v) * v.nodes:.2f} GiB at CHECKPOINT_WRITE_MIB_S={v.checkpoint_write_mib_s:g}) "
            f"and commit it before the pod is killed; use at least {needed}, or leave it unset",
        )


def _check_fault_targets(v: JobValues, given: _Given) -> None:
    """Every fault of FAULT_SPEC hits a pod, a rank and a step the job has."""
    ws = world_size(v)
    pods = v.nodes + v.spares
    for fault in parse_faults(v.fault_spec):
        if "node" in fault and fault["node"] >= pods:
            _fail(
                "FAULT_SPEC",
                v.fault_spec,
                f"node={fault['node']} does not exist: the Job has {pods} pods ({v.nodes} nodes + "
                f"{v.spares} spares), indexes 0-{pods - 1}",
            )
        if "rank" in fault and fault["rank"] >= ws:
            _fail(
                "FAULT_SPEC",
                v.fault_spec,
                f"rank={fault['rank']} does not exist: the world size is {ws} "
                f"({v.nodes} nodes x {procs_per_node(v)} processes)",
            )
        if "step" in fault and v.steps is not None and fault["step"] > v.steps:
            _fail("FAULT_SPEC", v.fault_spec, f"step={int(fault['step'])} is after the last step ({v.steps})")


def _check_fault_schedule(v: JobValues, given: _Given) -> None:
    """The fault schedule spares rank 0, so it needs another rank to fault."""
    if v.fault_schedule_seed is not None and world_size(v) < 2:
        _fail(
            "FAULT_SCHEDULE_SEED",
            v.fault_schedule_seed,
            "the schedule never faults rank 0, so it needs a world size of 2 or more",
        )


def _check_checkpoint_interval(v: JobValues, given: _Given) -> None:
    """A fixed interval writes at least one checkpoint, and only when checkpoints are on."""
    fixed_interval = v.checkpoint_interval if isinstance(v.checkpoint_interval, int) else None
    if fixed_interval is not None and v.steps is not None and fixed_interval > v.steps:
        _fail(
            "CHECKPOINT_INTERVAL",
            v.checkpoint_interval,
            f"is beyond the last step ({v.steps}); no checkpoint would be written",
        )
    if v.checkpoint_mode == "off" and v.checkpoint_interval is not None:
        _fail(
            "CHECKPOINT_INTERVAL", v.checkpoint_interval, "is set but CHECKPOINT_MODE=off; remove one of them"
        )


def _check_tiers(v: JobValues, given: _Given) -> None:
    """Memory tiers need the kit launcher, checkpoints, and room in /dev/shm for their copies."""
    memory = given.profile.memory_gib
    chosen = tiers(v)
    if chosen != "off" and v.launcher != "kit":
        _fail(
            "CHECKPOINT_TIERS",
            chosen,
            f"needs LAUNCHER=kit (it keeps each node's memory tier; {v.launcher} is a baseline): "
            "use CHECKPOINT_TIERS=off or auto",
        )
    if chosen != "off" and v.checkpoint_mode == "off":
        _fail("CHECKPOINT_TIERS", chosen, "is set but CHECKPOINT_MODE=off saves nothing; use off or auto")
    if chosen != "off" and v.checkpoint_tiers != "auto" and not v.entrypoint:
        need, room = tier_gib(v, chosen), v.shm_gib if v.shm_gib is not None else memory // 2
        if need > room:
            smaller = "use CHECKPOINT_TIERS=local or off" if chosen == "peer" else "use CHECKPOINT_TIERS=off"
            _fail(
                "CHECKPOINT_TIERS",
                chosen,
                f"needs {math.ceil(need)} GiB of /dev/shm per pod ({TIER_COPIES[chosen]} x "
                f"{staging_gib(v):.1f} GiB, the node's share of the checkpoint, with tier_keep="
                f"{tier_keep(v)}) and the pod has {room} GiB for it ("
                + ("SHM_GIB" if v.shm_gib is not None else f"half its {memory} GiB memory")
                + f"): {smaller}, or more NODES",
            )


def _check_shm(v: JobValues, given: _Given) -> None:
    """/dev/shm counts against the pod's memory, and holds one node's async checkpoint staging."""
    memory = given.profile.memory_gib
    shm = shm_gib(v)
    if shm > memory // 2:
        _fail("SHM_GIB", shm, f"is more than half the pod's {memory} GiB memory (the shm counts against it)")
    if v.checkpoint_mode == "async" and shm < staging_gib(v) and not v.entrypoint:
        _fail(
            "SHM_GIB",
            shm,
            f"is below the {staging_gib(v):.1f} GiB one node stages per async checkpoint; "
            "raise SHM_GIB or use more NODES",
        )


def _check_hugepages(v: JobValues, given: _Given) -> None:
    """Hugepages serve EFA, which the local profile has none of."""
    if v.hugepages_2mi_mib and given.profile.name == "local":
        _fail(
            "HUGEPAGES_2MI_MIB",
            v.hugepages_2mi_mib,
            "hugepages are for EFA nodes; remove it on PROFILE=local",
        )


def _check_nccl_env(v: JobValues, given: _Given) -> None:
    """NCCL settings that break the kit's restarts, from the profile's env or ENV."""
    user_env = {**given.profile.env, **v.env}
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


def _check_timeouts(v: JobValues, given: _Given) -> None:
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


_CrossCheck = typing.Callable[[JobValues, _Given], None]

_CROSS_CHECKS: tuple[_CrossCheck, ...] = (
    _check_profile_instance,
    _check_per_node_counts,
    _check_node_group_size,
    _check_stack_outputs,
    _check_claim_namespace,
    _check_elastic,
    _check_spares_launcher,
    _check_cordon_version,
    _check_termination_grace,
    _check_fault_targets,
    _check_fault_schedule,
    _check_checkpoint_interval,
    _check_timeouts,
    _check_tiers,
    _check_shm,
    _check_hugepages,
    _check_nccl_env,
)
"""Rules across fields, the hardware and the stack outputs, in the order `check_rules` applies them."""


def check_rules(v: JobValues, *, allow_placeholders: bool = False) -> None:
    """Rules across fields, the hardware and the stack outputs (`_CROSS_CHECKS`; the study's timeout
    invariants included), once every field passed `check_fields`."""
    given = _Given(profile=get_profile(v.profile), allow_placeholders=allow_placeholders)
    for check in _CROSS_CHECKS:
        check(v, given)


def advice(v: JobValues) -> list[str]:
    """Allowed but probably a mistake: one line each, shown as warnings (nothing here stops a render)."""
    notes = []
    if v.gpu_node_count is None and v.nodes > UNCHECKED_NODES_MAX:
        notes.append(
            f"NODES={v.nodes}: {world_size(v)} ranks, and without stack outputs the node group's size is "
            f"unknown (more than {UNCHECKED_NODES_MAX} nodes is rarely meant); check NODES, or pass "
            "OUTPUTS=<file> so GpuNodeCount bounds it"
        )
    if v.gpu_node_count is not None and get_profile(v.profile).requires_image and v.gpu_node_count < v.nodes:
        notes.append(
            f"NODES={v.nodes}: the GPU node group runs {v.gpu_node_count} nodes now (GpuNodeCount), so pods "
            f"wait until it runs {v.nodes}: make deploy CDK_ARGS='-c gpu.desired_nodes={v.nodes}' (after "
            "getting p5 capacity: a Capacity Block or an ODCR, docs/infra.md)"
        )
    if v.straggler_policy == "replace" and not v.spares:
        notes.append(
            "STRAGGLER_POLICY=replace without SPARES: no hot spare can take a slow node's place, so a "
            "straggler is only reported; set SPARES=1 or more"
        )
    return notes
