"""Everything the templates place, computed from trusted JobValues: names, ranks, env, command, checksum.

The templates contain no arithmetic and no decisions beyond one `if` per optional object; every number and
string in a manifest comes from `job_spec()`. This is the module the rank-discovery tests exercise.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import yaml

from fsdpkit.contracts import env as kit_env
from fsdpkit.contracts import exitcodes
from fsdpkit.contracts import metrics_settings as telemetry
from fsdpkit.contracts.cliargs import parse_int
from fsdpkit.contracts.labels import MANAGED_BY, RUN_ID_LABEL
from fsdpkit.k8s import elastic, security
from fsdpkit.k8s.derived import (
    checkpoint_interval,
    heartbeat_seconds,
    max_restarts,
    procs_per_node,
    shm_gib,
    termination_grace_s,
    tiers,
    world_size,
)
from fsdpkit.k8s.entrypoint import KIT_TRAINER_MODULE, Entrypoint, parse_entrypoint
from fsdpkit.k8s.kinds import trainer_job_name
from fsdpkit.k8s.model import (
    RESILIENCE_SECTIONS,
    RUNS_ROOT,
    SYSTEM_NODE_LABELS,
    TRAINER_FIELDS,
    JobValues,
    ValuesError,
)
from fsdpkit.k8s.profiles import get_profile

CONFIG_DIR = "/etc/kit"
CONFIG_FILE = "train.yaml"
CONTAINER = "trainer"
KIT_FSX_PVC = "kit-fsx"
LOCAL_PVC = "kit-local-runs"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
EXIT78_MARK_ENV = "KIT_EXIT78_MARK"
"""Env the exit-78 wrappers share: the file a worker creates when the trainer exits 78 (reserved)."""
CHECKSUM_ANNOTATION = "kit.io/config-sha256"
NODE_CORDON_ROLE = security.NODE_CORDON_ROLE
"""The ClusterRole that lets the node agent in a trainer pod cordon and label its own node
(STRAGGLER_POLICY=replace with spares; training/launcher/node_agent.py). Cluster-scoped and the same for
every run, so runs share it; each run binds it for itself (`security.node_access`)."""


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """The template context: plain data, JSON-serialisable, nothing left to compute."""

    values: dict[str, Any]
    namespace: str
    job_name: str
    service_name: str
    configmap_name: str
    service_account: str
    labels: dict[str, str]
    job_labels: dict[str, str]
    selector: dict[str, str]
    pod_annotations: dict[str, str]
    nodes: int
    procs_per_node: int
    world_size: int
    master_addr: str
    master_port: int
    ports: list[dict[str, Any]]
    rdzv_endpoint: str
    run_dir: str
    image: str
    image_pull_policy: str
    command: list[str]
    env: list[dict[str, Any]]
    resources: dict[str, str]
    node_selector: dict[str, str]
    tolerations: list[dict[str, str]]
    affinity: dict[str, Any] | None
    priority_class: str | None
    suspend: bool
    keeps_exit_78: str
    volumes: list[dict[str, Any]]
    volume_mounts: list[dict[str, Any]]
    config_yaml: str
    config_sha256: str
    config_comment: str
    """The ConfigMap's first comment: who reads the config (the kit's trainer, or ENTRYPOINT's script)."""
    pv: dict[str, Any] | None
    pvc: dict[str, Any] | None
    backoff_limit_per_index: int
    ttl_seconds_after_finished: int
    active_deadline_s: int | None
    termination_grace_s: int
    fail_job_exit_codes: list[int]
    """The pod's exit codes that fail the whole Job at once (podFailurePolicy FailJob; ascending, as the API
    requires): `FAIL_JOB_EXIT_CODES`."""
    kubernetes_version: str
    pods: int
    """Indexed Job completions: the training nodes plus the hot spares."""
    rdzv_store: dict[str, Any] | None
    """The rendezvous store's Deployment and Service (kit launcher only; the baselines keep pod 0)."""
    node_access: dict[str, Any] | None
    """The ClusterRole, this run's binding of it to the job's ServiceAccount and the admission policy that
    narrows it to the pod's own node (`security.node_access`); None unless the node agent renders."""
    automount_token: bool
    """Mount the ServiceAccount's API token in every container: never (only the node agent mounts one)."""
    init_containers: list[dict[str, Any]]
    """The node agent as a native sidecar when the cordon is on (`security.node_agent_container`), else []."""
    added_capabilities: list[str]
    """Capabilities the trainer container adds: IPC_LOCK where EFA pins memory, else none."""
    network_policy: dict[str, Any]
    """The run's NetworkPolicy: ingress only from the run's own pods (`security.network_policy`)."""
    psa_labels: dict[str, str]
    """Pod Security Admission labels of the namespace (`security.psa_labels`)."""
    kind: str
    """KIND (fsdpkit.k8s.kinds): the Job alone, or inside a JobSet, or a TrainJob's runtime."""


FAIL_JOB_EXIT_CODES = sorted((exitcodes.FATAL_CONFIG, exitcodes.RUN_FAILED))
"""fsdpkit.contracts.exitcodes: FATAL_CONFIG (78), a bad config; RUN_FAILED (69), a pod that found the run
ended in failure (a replacement or a spare: exiting 0 would mark its index succeeded). A new pod cannot help
either, so the Job's pod failure policy fails the Job at once; torchrun's and ft_launcher's pods never exit
69."""


RDZV_STORE_SUFFIX = "-rdzv"
"""Names the rendezvous store's Deployment and Service: <run_id>-rdzv."""
RDZV_STORE_COMPONENT = "rdzv-store"


def rdzv_store_host(run_id: str, namespace: str) -> str:
    """The store Service's DNS name (a ClusterIP: the address stays when the store pod is recreated)."""
    return f"{run_id}{RDZV_STORE_SUFFIX}.{namespace}.svc.cluster.local"


def master_addr(job: str, service: str, namespace: str) -> str:
    """Pod 0's stable DNS name: `<job>-0.<service>.<namespace>.svc.cluster.local` (needs `subdomain`)."""
    return f"{job}-0.{service}.{namespace}.svc.cluster.local"


def trainer_config(v: JobValues) -> dict[str, dict[str, Any]]:
    """The trainer config (contract 4) by section; None is left out so the trainer's default applies."""
    profile = get_profile(v.profile)
    config: dict[str, dict[str, Any]] = {
        "run": {"id": v.run_id, "root": RUNS_ROOT, "seed": v.seed},
        "model": {
            "name": v.model or profile.default_model,
            "activation_checkpointing": profile.activation_checkpointing,
        },
        "data": {
            "kind": v.data_kind,
            "path": v.data_path or None,
            "seq_len": v.seq_len or profile.seq_len,
            "batch_size": v.batch_size or profile.batch_size,
        },
        "optim": {},
        "training": {
            "steps": v.steps,
            "log_every": v.log_every,
            "deterministic": v.deterministic,
            "efa_devices": efa_devices(v) or None,
        },
        "parallel": {},
        "checkpoint": {
            "mode": v.checkpoint_mode,
            "interval": checkpoint_interval(v),
            "keep": v.checkpoint_keep,
            "backend": v.checkpoint_backend,
            # With ENTRYPOINT the state's size is the script's: auto is left to the pods (fsdpkit.resilience)
            "tiers": tiers(v)
            if v.checkpoint_mode != "off" and not (v.entrypoint and v.checkpoint_tiers == "auto")
            else None,
        },
        "fault": {
            "spec": v.fault_spec or None,
            "schedule_seed": v.fault_schedule_seed,
            "schedule_count": v.fault_schedule_count,
            "schedule_kinds": v.fault_schedule_kinds,
            "schedule_after_step": v.fault_schedule_after_step,
        },
        "inprocess": {
            "enabled": v.inprocess,
            "backend": v.inprocess_backend,
            "max_restarts": v.inprocess_max_restarts,
            "barrier_timeout_s": v.inprocess_barrier_timeout_s,
        },
    }
    # the trainer's default is left out, as None is: the ConfigMap of a job that keeps it does not change
    config["straggler"] = {"policy": None if v.straggler_policy == "report" else v.straggler_policy}
    for section, fields in v.train.items():
        config[section].update(fields)
    elastic.trainer_training(v, config["training"])
    cleaned = {s: {k: x for k, x in f.items() if x is not None} for s, f in config.items()}
    # A user's ENTRYPOINT reads only the resilience sections (the rules refuse model/data/optim values).
    sections = RESILIENCE_SECTIONS if v.entrypoint else TRAINER_FIELDS
    return {s: cleaned[s] for s in TRAINER_FIELDS if cleaned[s] and s in sections}


CONFIG_COMMENTS = {
    False: "Trainer config (contract 4): the container reads it with --config; the pods carry its sha256.",
    True: "Resilience config (run, training, checkpoint, fault, inprocess, straggler): ENTRYPOINT's script "
    "reads it from $KIT_CONFIG (fsdpkit.resilience.load_config); the pods carry its sha256.",
}


def cordons_nodes(v: JobValues) -> bool:
    """Whether the launcher in a trainer pod may cordon its own node: STRAGGLER_POLICY=replace evicts a slow
    node only when a hot spare takes its place, and then cordons it, so that the Job's replacement pod goes
    elsewhere."""
    return v.straggler_policy == "replace" and v.spares > 0


def node_failure_limit(v: JobValues) -> int:
    """NODE_FAILURE_LIMIT, else 3 with spares (one takes a given-up node's place), else 0 (never)."""
    if v.node_failure_limit is not None:
        return v.node_failure_limit
    return 3 if v.spares else 0


def efa_devices(v: JobValues) -> int:
    """EFA devices the trainer must prove before training: the profile's, when the job spans nodes (one
    node talks over NVLink and never uses the network); TRAIN.training.efa_devices=0 turns it off."""
    explicit = v.train.get("training", {}).get("efa_devices")
    if explicit is not None:
        try:
            return parse_int(explicit, "TRAIN.training.efa_devices", lo=0)
        except ValueError as exc:
            raise ValuesError(f"{exc} (0 skips the EFA check)") from None
    return get_profile(v.profile).efa if v.nodes > 1 else 0


# torchrun and ft_launcher turn any worker failure into exit 1, so a trainer's 78 (bad config) would be
# retried per index instead of failing the Job. Two POSIX sh wrappers keep it: each worker marks a file
# when the trainer exits 78, and the pod's wrapper exits 78 when the launcher failed and the mark exists.
# Signals: the worker wrapper defers SIGTERM until the trainer has exited (torchrun signals the worker's
# whole process group, so the trainer gets it directly); the pod wrapper, as PID 1 of the container
# (parent 0), forwards SIGTERM to the launcher, so a drain still reaches it; outside a container (the local
# runner signals the pod's process group) the launcher got it already. No `$(` and no `$$` in the scripts:
# Kubernetes would expand those.
def _worker_wrapper(run: str) -> str:
    return f'trap : TERM; {run}"$@"; rc=$?; if [ "$rc" -eq 78 ]; then : > "$KIT_EXIT78_MARK"; fi; exit "$rc"'


WORKER_WRAPPER = _worker_wrapper("python ")
"""Runs `python ARGS...` (a module or a script: the kit's trainer, or ENTRYPOINT's)."""
PROGRAM_WRAPPER = _worker_wrapper("")
"""Runs `PROGRAM ARGS...` (an ENTRYPOINT that is not python): the same trap and exit-78 mark."""


POD_WRAPPER = (
    f'KIT_EXIT78_MARK="${{TMPDIR:-/tmp}}/kit-exit78-${{POD_NAME:-pod}}"; export {EXIT78_MARK_ENV}; '
    'rm -f "$KIT_EXIT78_MARK"; '
    """trap 'term=1; if [ "$PPID" = 0 ]; then kill -TERM "$pid" 2>/dev/null; fi' TERM; """
    # A trap ends `wait` early (status > 128): wait again until the launcher's own status comes back. dash
    # may have reaped it already (so no `kill -0` test); a second wait then answers 127: the first was it.
    '"$@" & pid=$!; rc=; while :; do term=; wait "$pid"; r=$?; '
    'if [ "$r" -eq 127 ] && [ -n "$rc" ]; then break; fi; rc=$r; '
    'if [ -z "$term" ] || [ "$r" -le 128 ]; then break; fi; done; '
    'if [ "$rc" -ne 0 ] && [ -e "$KIT_EXIT78_MARK" ]; then exit 78; fi; exit "$rc"'
)


def worker_target(v: JobValues, *, config_path: str) -> list[str]:
    """What the launcher starts on every rank, in its own flags: `-m mod args`, `script args` or
    `--no-python prog args` (kit launcher); torchrun and ft_launcher start the worker wrapper instead
    (`--no-python sh -c WRAPPER kit-worker ...`), which runs python with the module or script, or the
    program itself, and keeps its exit 78."""
    entry = parse_entrypoint(v.entrypoint) or Entrypoint(
        kind="module", target=KIT_TRAINER_MODULE, args=("--config", config_path)
    )
    python = [*(["-m"] if entry.kind == "module" else []), entry.target, *entry.args]
    if v.launcher == "kit":
        return ["--no-python", entry.target, *entry.args] if entry.kind == "program" else python
    wrapper = PROGRAM_WRAPPER if entry.kind == "program" else WORKER_WRAPPER
    return ["--no-python", "sh", "-c", wrapper, "kit-worker", *python]


def rank_restart_in_place(v: JobValues) -> bool:
    """HSDP (TRAIN.parallel.replicate not 1) with the kit's in-process restart: a crashed worker is started
    again alone and restores from a live replica (fsdpkit.resilience.replica); its peers never restart."""
    replicate = v.train.get("parallel", {}).get("replicate", 1)
    return bool(v.inprocess) and (v.inprocess_backend or "kit") == "kit" and replicate not in (1, "1")


def launcher_command(v: JobValues, *, endpoint_host: str, config_path: str, run_dir: str) -> list[str]:
    """The container's argv: launcher flags (contract 4, torchrun names), then the worker's target: the
    kit's trainer and its config, or ENTRYPOINT (`worker_target`).

    The kit launcher exits 78 itself when a worker did; torchrun and ft_launcher run inside the two
    wrappers above (`--no-python` starts the worker wrapper instead of python), so they keep it too.
    """
    nnodes, nproc, port = v.nodes, procs_per_node(v), v.rdzv_port
    restarts = max_restarts(v)
    store_host = rdzv_store_host(v.run_id, v.namespace)
    trainer = worker_target(v, config_path=config_path)
    pod = ["sh", "-c", POD_WRAPPER, "kit-pod"]
    if v.launcher == "kit":
        cmd = [
            "python",
            "-m",
            "fsdpkit.launcher",
            f"--nnodes={elastic.nnodes(v)}",
            f"--nproc-per-node={nproc}",
            "--node-rank=$(NODE_RANK)",
            f"--spares={v.spares}",
            "--rdzv-backend=kit",
            f"--rdzv-endpoint={store_host}:{port}",
            f"--rdzv-id={v.run_id}",
            f"--rdzv-conf=is_host=0,join_timeout={v.replacement_wait_s},"
            f"keep_alive_interval={v.rdzv_keep_alive_s},keep_alive_max_attempt={v.rdzv_keep_alive_attempts}"
            + (f",last_call_timeout={v.elastic_wait_s}" if elastic.is_elastic(v) else ""),
            f"--max-restarts={restarts}",
            f"--monitor-interval={v.monitor_interval_s:g}",
            f"--heartbeat-timeout={v.heartbeat_timeout}",
            f"--heartbeat-load-timeout={v.heartbeat_load_timeout_s:g}",
            f"--node-failure-limit={node_failure_limit(v)}",
            f"--node-failure-window={v.node_failure_window_s}",
        ]
        if v.heartbeat_safety_factor is not None:
            cmd.append(f"--heartbeat-safety-factor={v.heartbeat_safety_factor:g}")
        if rank_restart_in_place(v):
            cmd.append("--rank-restart=in-place")
        cmd.append(f"--run-dir={run_dir}")
        return cmd + trainer
    if v.launcher == "ft_launcher":
        # No --node-rank with c10d (NVRx issue #142); the rendezvous orders the nodes.
        return [
            *pod,
            "ft_launcher",
            f"--nnodes={nnodes}:{nnodes}",
            f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint_host}:{port}",
            f"--rdzv-id={v.run_id}",
            f"--max-restarts={restarts}",
            f"--monitor-interval={v.monitor_interval_s:g}",
            f"--ft-initial-rank-heartbeat-timeout={v.heartbeat_load_timeout_s:g}",
            f"--ft-rank-heartbeat-timeout={heartbeat_seconds(v):g}",
            *trainer,
        ]
    # torchrun: the study's baseline, static rendezvous on pod 0.
    return [
        *pod,
        "python",
        "-m",
        "torch.distributed.run",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc}",
        "--node-rank=$(NODE_RANK)",
        f"--master-addr={endpoint_host}",
        f"--master-port={port}",
        f"--max-restarts={restarts}",
        f"--monitor-interval={v.monitor_interval_s:g}",
        *trainer,
    ]


def metrics_sink(v: JobValues) -> str:
    """Where the pods' live metrics go: `metrics`, with auto = the CloudWatch agent on EKS, the run folder
    with the local profile (no agent there)."""
    if v.metrics != "auto":
        return v.metrics
    return "agent" if get_profile(v.profile).requires_image else "file"


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def container_env(v: JobValues, *, addr: str, run_dir: str, config_path: str) -> list[dict[str, Any]]:
    """Kit-owned env first (rank discovery, run folder), then profile and user env sorted by name."""
    owned: list[dict[str, Any]] = [
        _field_env("NODE_RANK", f"metadata.annotations['{INDEX_ANNOTATION}']"),
        _field_env(kit_env.POD_NAME, "metadata.name"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        _field_env("POD_IP", "status.podIP"),
        {"name": "MASTER_ADDR", "value": addr},
        {"name": "MASTER_PORT", "value": str(v.rdzv_port)},
        {"name": "NNODES", "value": str(v.nodes)},
        {"name": "NPROC_PER_NODE", "value": str(procs_per_node(v))},
        {"name": "WORLD_SIZE", "value": str(world_size(v))},
        {"name": "RUN_ID", "value": v.run_id},
        {"name": "RUN_DIR", "value": run_dir},
        {"name": kit_env.CONFIG, "value": config_path},
        {"name": kit_env.GRACE_S, "value": str(termination_grace_s(v))},
        # Live metrics (fsdpkit.contracts.metrics_settings): the launcher and the trainer read the same four.
        {"name": telemetry.SINK_ENV, "value": metrics_sink(v)},
        {"name": telemetry.CLUSTER_ENV, "value": v.cluster_name or "local"},
        {"name": telemetry.JOB_ENV, "value": v.run_id},
        {"name": telemetry.LOG_GROUP_ENV, "value": telemetry.log_group_name(v.cluster_name or "local")},
    ]
    if cordons_nodes(v):  # the node a straggler's launcher cordons (training/launcher/node_actions.py)
        owned.append(_field_env(kit_env.NODE_NAME, "spec.nodeName"))
    if security.cordon_allowed(v):  # the launcher hands the cordon to the node agent, which holds the token
        owned.append({"name": security.NODE_AGENT_DIR_ENV, "value": security.NODE_AGENT_DIR})
    if security.on_cluster(v):  # the run's token (the local runner writes its own file and sets it)
        owned.append(security.run_token_env())
    if v.launcher in ("kit", "torchrun"):
        # torch >= 2.5 shares the agent's store with workers: restarts read stale keys (torch-on-cpu 3.2).
        owned.append({"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"})
    profile = get_profile(v.profile)
    defaults: dict[str, str] = {
        "PYTHONUNBUFFERED": "1",
        "TORCH_CPP_LOG_LEVEL": "error",
        "NCCL_NVLS_ENABLE": "0",
        "HF_HOME": f"{run_dir}/cache/huggingface",  # /fsx/cache is read-only: a shared cache is an input
        **profile.env,
    }
    if profile.gpus:
        defaults["NCCL_DEBUG"] = v.nccl_debug.upper()
    if efa_devices(v):
        # The trainer's EFA proof reads NCCL's own log (training/runtime/efa.py): INFO for INIT and NET, into
        # a file per process in the run folder, where it also helps whoever debugs the fabric later.
        if defaults.get("NCCL_DEBUG") != "TRACE":
            defaults["NCCL_DEBUG"] = "INFO"
        defaults["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
        defaults["NCCL_DEBUG_FILE"] = f"{run_dir}/nccl/%h-%p.log"
    if v.inprocess:
        defaults["TORCH_NCCL_RETHROW_CUDA_ERRORS"] = "0"
    merged = {**defaults, **v.env}
    return owned + [{"name": k, "value": merged[k]} for k in sorted(merged)]


def _resources(v: JobValues) -> dict[str, str]:
    profile = get_profile(v.profile)
    res = {"cpu": str(profile.cpu), "memory": f"{profile.memory_gib}Gi"}
    if profile.gpus:
        res["nvidia.com/gpu"] = str(profile.gpus)
    if profile.efa:
        res["vpc.amazonaws.com/efa"] = str(profile.efa)
    if v.hugepages_2mi_mib:
        res["hugepages-2Mi"] = f"{v.hugepages_2mi_mib}Mi"
    return res


def _tolerations(v: JobValues) -> list[dict[str, str]]:
    if not get_profile(v.profile).gpus:
        return []
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    if v.gpu_node_taint:
        key_value, _, effect = v.gpu_node_taint.rpartition(":")
        key, sep, value = key_value.partition("=")
        own = (
            {"key": key, "operator": "Equal", "value": value, "effect": effect}
            if sep
            else {"key": key, "operator": "Exists", "effect": effect}
        )
        if own["key"] != "nvidia.com/gpu":  # the Exists toleration above already covers any value of it
            tolerations.append(own)
    return tolerations


def _node_selector(v: JobValues) -> dict[str, str]:
    profile = get_profile(v.profile)
    if v.node_selector:
        return dict(sorted(v.node_selector.items()))
    if profile.gpus:
        return {"node.kubernetes.io/instance-type": v.gpu_instance_type or profile.instance_type}
    return {}


def _storage(v: JobValues) -> tuple[str, dict[str, Any] | None, dict[str, Any] | None]:
    """(claim name, PV or None, PVC or None): the kit's static FSx PV/PVC unless CDK made a claim."""
    if v.fsx_pvc:
        return v.fsx_pvc, None, None
    if not get_profile(v.profile).requires_image:
        return (
            LOCAL_PVC,
            None,
            {"name": LOCAL_PVC, "storage": "10Gi", "storage_class": None, "volume_name": None},
        )
    pv_name = f"{KIT_FSX_PVC}-{v.namespace}"
    pv = {
        "name": pv_name,
        "storage": f"{v.fsx_storage_gib}Gi",
        "volume_handle": v.fsx_file_system_id,
        "dns_name": v.fsx_dns_name,
        "mount_name": v.fsx_mount_name,
    }
    return (
        KIT_FSX_PVC,
        pv,
        {
            "name": KIT_FSX_PVC,
            "storage": f"{v.fsx_storage_gib}Gi",
            "storage_class": "",
            "volume_name": pv_name,
        },
    )


def rdzv_store(v: JobValues, labels: dict[str, str]) -> dict[str, Any] | None:
    """The store pod's Deployment and Service context; None for the baselines (their store is pod 0's).

    It runs the trainer pods' image (IMAGE, the user's one too: it is built FROM the kit's), so the store
    and the launchers that talk to it always come from the same kit code."""
    if v.launcher != "kit":
        return None
    name = f"{v.run_id}{RDZV_STORE_SUFFIX}"
    selector = {"app.kubernetes.io/name": "kit-rdzv-store", RUN_ID_LABEL: v.run_id}
    local = not security.on_cluster(v)
    return {
        "name": name,
        "labels": {**labels, **selector, "app.kubernetes.io/component": RDZV_STORE_COMPONENT},
        "selector": selector,
        "port": v.rdzv_port,
        "command": ["python", "-m", "fsdpkit.launcher.store", f"--port={v.rdzv_port}"],
        "node_selector": {} if local else dict(SYSTEM_NODE_LABELS),
        "resources": {"cpu": "500m", "memory": "1Gi"},
        "env": [] if local else [security.run_token_env()],
        "volumes": [] if local else [security.run_token_volume(v)],
        "volume_mounts": [] if local else [security.run_token_mount()],
    }


def _selector_and_labels(v: JobValues) -> tuple[dict[str, str], dict[str, str]]:
    """(selector, labels): the selector picks this run's pods; the labels add who manages them and how."""
    selector = {"app.kubernetes.io/name": "kit-trainer", RUN_ID_LABEL: v.run_id}
    labels = {
        **selector,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "app.kubernetes.io/instance": v.run_id,
        "kit.io/profile": v.profile,
        "kit.io/launcher": v.launcher,
    }
    return selector, labels


def _ports(port: int) -> list[dict[str, Any]]:
    """The rendezvous port and the two stores above it (hence RDZV_PORT's upper bound)."""
    return [
        {"name": "rdzv", "port": port},
        {"name": "store", "port": port + 1},
        {"name": "store-inproc", "port": port + 2},
    ]


def _affinity(v: JobValues) -> dict[str, Any] | None:
    """GPU pods of one run on distinct nodes: each takes a whole node (one pod per node)."""
    if not get_profile(v.profile).gpus:
        return None
    return {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {RUN_ID_LABEL: v.run_id}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }


def _volumes(v: JobValues, claim: str) -> list[dict[str, Any]]:
    """The shared file system, the memory-backed /dev/shm, the trainer config, and on EKS the run's token
    and the node agent's folder and token (`_volume_mounts`)."""
    volumes = [
        {"name": "fsx", "persistentVolumeClaim": {"claimName": claim}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_gib(v)}Gi"}},
        {"name": "config", "configMap": {"name": f"{v.run_id}-config"}},
    ]
    if security.on_cluster(v):
        volumes.append(security.run_token_volume(v))
    if security.cordon_allowed(v):
        volumes.extend(security.node_agent_volumes())
    return volumes


def _volume_mounts(v: JobValues) -> list[dict[str, Any]]:
    """Where `_volumes` appear in the trainer container: the run's folder read-write and the inputs
    read-only (`security.storage_mounts`); never the node agent's token."""
    mounts = [
        *security.storage_mounts(v),
        {"name": "shm", "mountPath": "/dev/shm"},
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
    ]
    if security.on_cluster(v):
        mounts.append(security.run_token_mount())
    if security.cordon_allowed(v):
        mounts.append({"name": "node-agent", "mountPath": security.NODE_AGENT_DIR})
    return mounts


def job_spec(v: JobValues) -> JobSpec:
    """Derive the template context from validated values."""
    job = service = v.run_id
    addr = master_addr(trainer_job_name(v.kind, v.run_id), service, v.namespace)
    run_dir = f"{RUNS_ROOT}/{v.run_id}"
    config_path = f"{CONFIG_DIR}/{CONFIG_FILE}"
    config = trainer_config(v)
    config_yaml = yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
    digest = hashlib.sha256(config_yaml.encode()).hexdigest()
    selector, labels = _selector_and_labels(v)
    claim, pv, pvc = _storage(v)
    port = v.rdzv_port
    affinity = _affinity(v)
    image = v.image or "kit-trainer:local"
    pull = security.pull_policy(v, image)
    agent = security.node_agent_container(v, image=image, pull=pull) if security.cordon_allowed(v) else None
    return JobSpec(
        values={k: getattr(v, k) for k in v.__dataclass_fields__},
        namespace=v.namespace,
        job_name=job,
        service_name=service,
        configmap_name=f"{v.run_id}-config",
        service_account=v.service_account,
        labels=labels,
        job_labels={**labels, **({KUEUE_QUEUE_LABEL: v.kueue_queue} if v.kueue_queue else {})},
        selector=selector,
        pod_annotations={CHECKSUM_ANNOTATION: digest},
        nodes=v.nodes,
        procs_per_node=procs_per_node(v),
        world_size=world_size(v),
        master_addr=addr,
        master_port=port,
        ports=_ports(port),
        rdzv_endpoint=f"{addr}:{port}",
        run_dir=run_dir,
        image=image,
        image_pull_policy=pull,
        command=launcher_command(v, endpoint_host=addr, config_path=config_path, run_dir=run_dir),
        env=container_env(v, addr=addr, run_dir=run_dir, config_path=config_path),
        resources=_resources(v),
        node_selector=_node_selector(v),
        tolerations=_tolerations(v),
        affinity=affinity,
        priority_class=v.priority_class or None,
        suspend=bool(v.kueue_queue),  # Kueue admits the whole gang, then unsuspends the Job
        keeps_exit_78="the kit launcher exits 78 itself"
        if v.launcher == "kit"
        else f"{v.launcher} runs inside the kit's sh wrappers, which keep the trainer's 78",
        volumes=_volumes(v, claim),
        volume_mounts=_volume_mounts(v),
        config_yaml=config_yaml,
        config_sha256=digest,
        config_comment=CONFIG_COMMENTS[bool(v.entrypoint)],
        pv=pv,
        pvc=pvc,
        backoff_limit_per_index=v.backoff_limit_per_index,
        ttl_seconds_after_finished=v.ttl_seconds_after_finished,
        active_deadline_s=v.active_deadline_s,
        termination_grace_s=termination_grace_s(v),
        fail_job_exit_codes=FAIL_JOB_EXIT_CODES,
        kubernetes_version=v.kubernetes_version,
        pods=v.nodes + v.spares,
        rdzv_store=rdzv_store(v, labels),
        node_access=security.node_access(v),
        automount_token=False,
        init_containers=[agent] if agent else [],
        added_capabilities=["IPC_LOCK"] if get_profile(v.profile).efa else [],
        network_policy=security.network_policy(v),
        psa_labels=security.psa_labels(v.kubernetes_version),
        kind=v.kind,
    )
