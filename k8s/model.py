"""The typed values of one training Job: fields, types, defaults and docs, and the constants they use.

Pure data: `JobValues` holds what a user may choose; it does not parse or check anything. Parsing lives in
`fsdpkit.k8s.overrides`, rules in `fsdpkit.k8s.rules`, derived numbers in `fsdpkit.k8s.derived`, and
`fsdpkit.k8s.values.build_values()`
is the one way to make trusted values. Field docstrings feed docs/k8s.md (`fsdpkit.k8s.docs`).
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fsdpkit.contracts import env as kit_env
from fsdpkit.k8s.profiles import ProfileName

Launcher = Literal["kit", "ft_launcher", "torchrun"]
ModelName = Literal["tiny", "small", "llama3.1-8b", "llama3.1-70b"]
DataKind = Literal["synthetic", "shards"]
CheckpointMode = Literal["off", "sync", "async"]
CheckpointBackend = Literal["kit", "dcp", "nvrx"]
CheckpointTiers = Literal["auto", "peer", "local", "off"]
InprocessBackend = Literal["kit", "nvrx"]
PullPolicy = Literal["Always", "IfNotPresent"]
MetricsSink = Literal["auto", "agent", "file", "off"]
Kind = Literal["job", "jobset", "trainjob"]

FSX_MOUNT = "/fsx"
"""Where the FSx volume is mounted in every pod."""
RUNS_ROOT = f"{FSX_MOUNT}/runs"
"""run.root of every Job: one folder per run id below it (contract 3), never shared between runs."""
KEEP_ALIVE_S_RANGE = (0.1, 60.0)
KEEP_ALIVE_ATTEMPTS_MAX = 100
KEEP_ALIVE_STALL_MIN_S = 1.0
RDZV_TIMEOUT_MAX_S = 7 * 24 * 3600
"""The kit launcher's keep-alive and rendezvous timeout bounds (training/launcher/cli.py says why), checked
here before a Job starts."""
PLACEHOLDER = "PLACEHOLDER"
"""Prefix of the values a dry run fills in when no stack outputs exist; `apply` refuses them."""

# Trainer config fields (contract 4). Fields that JobValues types itself may not be set through TRAIN.*.
TRAINER_FIELDS: Mapping[str, tuple[str, ...]] = types.MappingProxyType(
    {
        "run": ("id", "root", "seed"),
        "model": ("name", "activation_checkpointing", "compile"),
        "data": ("kind", "path", "seq_len", "batch_size"),
        "optim": ("lr", "min_lr", "warmup_steps", "weight_decay", "grad_clip"),
        "training": ("steps", "log_every", "deterministic", "grad_accum_steps", "efa_devices"),
        "parallel": ("replicate", "shard"),
        "checkpoint": ("mode", "interval", "keep", "backend"),
        "fault": ("spec", "schedule_seed", "schedule_count", "schedule_kinds", "schedule_after_step"),
        "inprocess": ("enabled", "backend", "max_restarts", "barrier_timeout_s"),
        "straggler": ("policy", "every", "confirm", "warmup", "min_margin", "noise_k"),
    }
)

RESILIENCE_SECTIONS: tuple[str, ...] = (
    "run", "training", "parallel", "checkpoint", "fault", "inprocess", "straggler",
)  # fmt: skip
"""The config sections a script's resilience API reads (fsdpkit.resilience.load_config); with ENTRYPOINT
the ConfigMap holds only these. model, data and optim are the kit trainer's own."""

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
        kit_env.HEARTBEAT_DIR,
        kit_env.CONFIG,
        kit_env.GRACE_S,
        kit_env.POD_ROOT_PID,
        "KIT_EXIT78_MARK",
        kit_env.NODE_NAME,
        "RUN_ID",
        "RUN_DIR",
        kit_env.POD_NAME,
        "POD_IP",
        "POD_NAMESPACE",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
        kit_env.RUN_TOKEN_FILE,
        "KIT_NODE_AGENT_DIR",
    }
)
RESERVED_ENV_PREFIXES: tuple[str, ...] = ("TORCHELASTIC_", "PET_")

# Parameter counts used only to size /dev/shm for async checkpoint staging (upper bounds).
MODEL_PARAMS: Mapping[str, float] = types.MappingProxyType({"tiny": 2e6, "small": 5e7, "llama3.1-8b": 8.03e9})
CKPT_BYTES_PER_PARAM = 12
"""fp32 parameters + two AdamW moments: what one checkpoint holds per parameter."""

DRAIN_MARGIN_S = 30
"""Grace beyond the drain's writes: the step in progress, the commit record, the exit of every process."""
SYSTEM_NODE_LABELS: Mapping[str, str] = types.MappingProxyType({"role": "system"})
"""Labels of the cluster's system node group (infra/constructs/cluster.py SYSTEM_NODE_LABELS): the
rendezvous store runs there, never on a GPU node a fault can take away."""

LAUNCHER_DEFAULT_RESTARTS: Mapping[str, int] = types.MappingProxyType(
    {"kit": 10, "ft_launcher": 20, "torchrun": 0}
)
FT_AUTO_HEARTBEAT_S = 900.0
"""ft_launcher has no "auto" heartbeat; the study's --ft-rank-heartbeat-timeout is used instead."""

RUN_ID_MAX = 48
"""Leaves room for `-<index>` in pod hostnames and `-config` in the ConfigMap name (63-char labels)."""


class ValuesError(ValueError):
    """A value that breaks a rule; the message is one line: the key, the value seen, the rule and the fix."""


@dataclass(kw_only=True)
class JobValues:
    """Everything a user may choose for one training Job. Field docs feed docs/k8s.md (`fsdpkit.k8s.docs`)."""

    # -- job --
    run_id: str = ""
    """Run id: names the Job, its Service and ConfigMap, and the run folder /fsx/runs/<run_id>. Lower-case
    letters, digits and '-', starting with a letter, at most 48 characters. Empty: generated from the UTC
    time (kit-YYYYMMDD-HHMMSS). Reuse an id only to resume that run."""
    namespace: str = "kit-training"
    """Kubernetes namespace of the Job (created if missing)."""
    kind: Kind = "job"
    """Which object runs the pods: job (an Indexed Job and the store's Deployment: no controller needed),
    jobset (a JobSet, jobset.x-k8s.io/v1alpha2: needs JobSet v0.12) or trainjob (a Kubeflow Trainer v2.3
    TrainJob on the run's own ClusterTrainingRuntime fsdpkit-<run_id>: needs Trainer). The pods, their
    command and the kit's recovery are the same in each (docs/k8s.md, "Three kinds")."""
    profile: ProfileName = "p5"
    """Node profile: p5, p4d, g5 or local (CPU processes on this machine). Taken from the stack output
    GpuInstanceType when the outputs file is read."""
    nodes: int = 2
    """Nodes that train (one pod each). Default: the stack output GpuNodeCount when it is above 0, else 2."""
    spares: int = 0
    """Hot spares: extra pods (NODES+SPARES in all) that wait warm (torch imported, joined to the rendezvous,
    no GPU work) and replace a lost or drained node at once; the Job's replacement pod becomes the new
    spare. The world size stays NODES x processes (with MIN_NODES, a spare comes first: the job shrinks only
    when none is left). A spare left at the end exits 0. LAUNCHER=kit only."""
    min_nodes: int | None = None
    """Elastic training: the fewest nodes the job goes on with (1 to NODES). When a node is lost and its
    replacement pod has not joined within ELASTIC_WAIT_S, the others re-form without it and resume from the
    last checkpoint resharded onto fewer ranks, with the same global batch (more micro-batches per rank); a
    node that joins later is taken back at the next step boundary (saved first, as a drain is) and the job
    reshards onto it. Every node count from MIN_NODES to NODES must split the global batch exactly
    (TRAIN.training.global_batch; default NODES x processes x BATCH_SIZE x TRAIN.training.grad_accum_steps;
    required with ENTRYPOINT). Losses then match a fixed-size run to fp32 rounding, not bitwise (the
    reduction order changes); the data order does not change. None: exactly NODES. LAUNCHER=kit only.
    With SPARES a spare takes a lost node's place first; the job shrinks only when none is left."""
    elastic_wait_s: int = 60
    """With MIN_NODES: seconds the surviving nodes wait for a lost node's replacement before they go on with
    fewer (the kit rendezvous' last call); the first round also waits this long for the last NODES once
    MIN_NODES have joined. Below REPLACEMENT_WAIT_S."""
    procs_per_node: int | None = None
    """Training processes per pod. None: one per GPU (GPU profiles), 1 on local."""
    gpus_per_node: int | None = None
    """GPUs each pod requests. None: all of the instance's; other numbers are refused (one pod per node)."""
    efa_per_node: int | None = None
    """EFA devices each pod requests. None: all of the instance's; any other number is an error."""
    image: str = ""
    """Container image of the trainer pods and the rendezvous store: the kit's, or your own with the kit's
    wheel installed (the launcher and the store run from it: docs/own-model.md), written
    [REGISTRY[:PORT]/]PATH[:TAG][@sha256:DIGEST] with a lower-case path, e.g.
    123456789012.dkr.ecr.us-east-2.amazonaws.com/my-train:v1. Empty: <EcrRepositoryUri>:<image_tag> from the
    stack outputs. Required on EKS."""
    image_tag: str = "latest"
    """Tag appended to the ECR repository when `image` is empty. The repository's tags are immutable: `make
    image` pushes a tag of its own per build (the commit) and prints the digest to pass as IMAGE."""
    image_pull_policy: PullPolicy | None = None
    """Kubernetes imagePullPolicy. None: IfNotPresent for an image by digest (@sha256:..., what `make image`
    prints), Always for a tag (a tag may be pushed again: cached nodes would run old code beside new)."""
    service_account: str = "kit-trainer"
    """Service account of the pods (created; no API token is mounted, except with STRAGGLER_POLICY=replace
    and SPARES into the node agent sidecar alone, which cordons the slow pod's own node: docs/k8s.md)."""
    kueue_queue: str = ""
    """Kueue LocalQueue for gang admission (label kueue.x-k8s.io/queue-name on the Job): Kueue then admits
    all NODES pods at once or none, so a job never holds half its GPUs idle while it waits. Empty: no
    Kueue; the Job is scheduled pod by pod."""
    priority_class: str = ""
    """PriorityClass of the pods (priorityClassName; Kueue also orders its queue by it). The class must
    exist in the cluster. Empty: the cluster's default priority."""

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
    """Rendezvous port (the kit's store pod; pod 0 for torchrun and ft_launcher); the next two ports are kept
    free for the trainer's and in-process stores."""
    replacement_wait_s: int = 600
    """Seconds the surviving nodes wait for the group to re-form after a node is lost (a spare joins at
    once; without one, the Job's replacement pod) before they give up (rendezvous join_timeout)."""
    rdzv_keep_alive_s: float = 0.1
    """Seconds between the kit launcher's rendezvous beats (`--rdzv-conf keep_alive_interval`): each is one
    small write of the node's own key on the store pod (NODES+SPARES / RDZV_KEEP_ALIVE_S a second: 680 for
    64+4 nodes). A silent node is judged gone after 3x its own recent beat gap (0.36 s on a quiet host),
    never later than RDZV_KEEP_ALIVE_S x RDZV_KEEP_ALIVE_ATTEMPTS (1.2 s), which bounds how long a silently
    lost node holds up the group. Between 0.1 and 60. torchrun and ft_launcher keep their own set-up."""
    rdzv_keep_alive_attempts: int = 12
    """Keep-alive intervals a node may miss before it is dropped (`keep_alive_max_attempt`, 2-100).
    (RDZV_KEEP_ALIVE_ATTEMPTS - 1) x RDZV_KEEP_ALIVE_S must be at least 1 s: how long a live launcher's
    keep-alive may stall (a busy node, a slow store) before the group restarts without it."""
    node_failure_limit: int | None = None
    """A node that fails this many times by itself (a worker killed by a signal, or its own hang) within
    NODE_FAILURE_WINDOW_S is given up: its pod exits 75 and a spare or the replacement takes its place.
    0: never. None: 3 with SPARES, else 0 (without a spare, giving a node up waits for the Job's
    replacement pod, and dense fault schedules on one node would end the job)."""
    node_failure_window_s: int = 600
    """Seconds over which NODE_FAILURE_LIMIT counts a node's failures."""

    # -- trainer (contract 4; None leaves the trainer's own default) --
    entrypoint: str = ""
    """Your training command instead of the kit's trainer, one string split as a shell would (quotes, no
    expansion): "python -m myproject.train --cfg x" (a module), "python train.py --steps 20" (a script,
    relative to the image's working directory; the repository root locally) or "bash run.sh" (any program).
    The launcher runs it on every rank; it gets no --config: the kit's resilience config is the file
    $KIT_CONFIG (fsdpkit.resilience.load_config() reads it), which then holds only the run, training,
    checkpoint, fault, inprocess and straggler sections, so MODEL, DATA_KIND, DATA_PATH, SEQ_LEN, BATCH_SIZE
    and TRAIN.model/data/optim.* are refused. Later words may use $(VAR) of the pod's env (Kubernetes expands
    it; $$ is a literal $). Empty: the kit's trainer (python -m fsdpkit.trainer --config $KIT_CONFIG)."""
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
    checkpoint_interval: int | Literal["auto"] | None = None
    """Steps between checkpoints, or auto: chosen by the run from the measured save cost, step time and
    faults (Young/Daly; bounds and MTBF prior via TRAIN.checkpoint.interval_min, interval_max, mtbf_s).
    None: the profile's default, auto on p5, p4d and g5 (what `make plan` would pick), the trainer's fixed
    default on local."""
    checkpoint_keep: int | None = None
    """Committed checkpoints kept (at least 2: the newest may still be in flight)."""
    checkpoint_backend: CheckpointBackend | None = None
    """Checkpoint writer: kit, dcp or nvrx."""
    checkpoint_tiers: CheckpointTiers = "auto"
    """Memory tiers in each pod's /dev/shm: peer (the node's state in its own memory and a copy on the next
    node: a restarted worker or a lost node's replacement restores without reading FSx), local (own memory
    only), off. auto: peer when its copies fit in /dev/shm (at most half the pod's memory), else local, else
    off; one node: local. The rendered config holds the choice."""
    fault_spec: str = ""
    """Injected faults, comma-separated, each at step=N or time=SECONDS (after trainer start). Rank kinds
    KIND:step=N:rank=R: kill, hang, sigstop, exception, oom, and slow (a straggler, which also takes
    factor=F: slow:step=N:rank=R:factor=F, 1 < F <= 100). Node kinds act on a whole pod, K its completion
    index (pod 0 included): node (every process SIGKILLed at once), freeze (every process SIGSTOPped: a
    silent node loss) and drain (SIGTERM, then SIGKILL after the grace period), as node:step=N:node=K.
    E.g. kill:step=20:rank=1,exception:step=45:rank=1,drain:time=60:node=0. Empty: none."""
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
    metrics: MetricsSink = "auto"
    """Live metrics (docs/metrics.md): agent (CloudWatch EMF through the node's CloudWatch agent: the stacks'
    dashboard and alarms), file (EMF records in the run folder's metrics/), off; auto: agent on EKS, file with
    the local profile."""
    inprocess_backend: InprocessBackend | None = None
    """In-process restart implementation: kit or nvrx."""
    inprocess_max_restarts: int | None = None
    """In-process restarts before the launcher takes over."""
    inprocess_barrier_timeout_s: float | None = None
    """Seconds the in-process restart waits for all ranks; must stay below a numeric heartbeat_timeout."""
    straggler_policy: Literal["off", "report", "replace"] = "report"
    """Stragglers (a rank that only computes slower, docs/runbook.md): report (an event and one line naming
    the rank and node, its cost in the goodput report), replace (also evict its node at the next step
    boundary as a drain does, so a hot spare takes over: needs SPARES) or off."""
    train: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Other trainer config fields, set as TRAIN.<section>.<field>=<value> (e.g. TRAIN.optim.lr=1e-4)."""

    # -- pod --
    shm_gib: int | None = None
    """Size of the memory-backed /dev/shm, GiB. None: what the memory tiers hold (CHECKPOINT_TIERS: a node's
    share of the checkpoint for the kept step and the one being written, twice with peer copies), at
    least twice the per-node share and the profile's minimum. Counts against the pod's memory."""
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
    termination_grace_s: int | None = None
    """Seconds between SIGTERM and SIGKILL when a pod stops (drain, eviction, `make train-job-delete`): the
    job saves and commits the step it stopped at in that time. None: sized from the checkpoint and
    CHECKPOINT_WRITE_MIB_S (2 checkpoint writes + 30 s); a shorter value is refused."""
    checkpoint_write_mib_s: float = 1000.0
    """Write speed of the run folder for one checkpoint of the whole job, MiB/s (FSx's throughput, shared by
    all nodes; `python -m bench.checkpoint` measures it). Sizes TERMINATION_GRACE_S."""

    # -- cluster (from the stack outputs) --
    cluster_name: str = ""
    """EKS cluster name (stack output ClusterName)."""
    region: str = ""
    """AWS region (stack output Region)."""
    gpu_instance_type: str = ""
    """Instance type of the GPU node group (stack output GpuInstanceType); must match the profile."""
    gpu_node_count: int | None = None
    """Nodes the GPU node group runs now (stack output GpuNodeCount; 0 until capacity is there: infra's
    capacity-safe default)."""
    gpu_max_nodes: int | None = None
    """Most nodes the GPU node group may scale to (stack output GpuMaxNodes); the Job may not ask for more.
    Older outputs files without it bound the Job by GpuNodeCount."""
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
    """Kubernetes version of the cluster, MAJOR.MINOR, for schema validation (stack output
    KubernetesVersion if any). Supported: 1.29 (the first with backoffLimitPerIndex and
    podReplacementPolicy on by default) up to the newest schemas kubernetes-validate bundles."""
