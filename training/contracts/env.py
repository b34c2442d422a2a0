"""Every environment variable one part of the kit sets for another, named once.

Two boundaries cross through the environment: the pod's (k8s/spec.py and the local runner render these
into every container; the launcher and the trainer read them) and the launcher's (the kit launcher sets
these for its workers). A name read on one side and written on the other lives here, so a rename is one
edit and a reader can see the whole contract in one place. The live-metrics variables are
`metrics_settings`'s; torch.distributed's own (RANK, WORLD_SIZE, MASTER_ADDR, ...) are torch's.
"""

from __future__ import annotations

# -- set by the Job (k8s/spec.py) or the local runner (k8s/local.py), read in the pod -----------------------

CONFIG = "KIT_CONFIG"
"""The job's resilience/trainer config file (the ConfigMap's train.yaml): `load_config` reads it when no
--config is given."""
POD_NAME = "POD_NAME"
"""The pod's name (downward API `metadata.name`): how a process finds the pod it belongs to."""
NODE_NAME = "KIT_NODE_NAME"
"""The pod's node (downward API `spec.nodeName`): the node a straggler's launcher cordons."""
RUN_TOKEN_FILE = "KIT_RUN_TOKEN_FILE"
"""A file holding the run's secret token (64 hex characters, 32 random bytes; a trailing newline allowed),
mounted from the run's own Secret into its pods only (k8s/spec.py), written per run by the local runner.
The kit's stores and rendezvous refuse a client without it; unset or absent: no token."""
LOCAL_ADDR = "KIT_LOCAL_ADDR"
"""The address a launcher advertises for its workers' store and where the stores bind (the local runner sets
127.0.0.1, so a local run listens on the loopback address only); unset: the host's FQDN, listening on every
interface (a pod on EKS)."""
NODE_AGENT_DIR = "KIT_NODE_AGENT_DIR"
"""The folder a trainer pod's launcher shares with its node agent (the sidecar that alone holds an API token,
fsdpkit.launcher.node_agent); unset: the launcher calls the API server itself."""
GRACE_S = "KIT_TERMINATION_GRACE_S"
"""The Job's terminationGracePeriodSeconds: how long a drained pod has between SIGTERM and SIGKILL."""
TIER_BASE = "KIT_TIER_BASE"
"""Where the launcher makes its node's memory-tier folder (default `SHM`); the local runner gives each pod its
own, as each pod on EKS has its own /dev/shm."""
SHM = "/dev/shm"
"""The pod's memory-backed folder (an emptyDir of medium Memory on EKS)."""

# -- set by the kit launcher for its workers ---------------------------------------------------------------

HEARTBEAT_DIR = "KIT_HEARTBEAT_DIR"
"""The folder each rank beats into (training/runtime/heartbeat.py) and the launcher watches."""
TIER_DIR = "KIT_TIER_DIR"
"""The node's memory-tier folder, made by the launcher so it outlives every worker."""
SPARES = "KIT_SPARES"
"""The job's hot spares (--spares): the straggler policy `replace` evicts a node only when a spare can
take over."""
RANK_RESTART = "KIT_RANK_RESTART"
"""`in-place` (--rank-restart in-place): a crashed worker is started again alone and rejoins its peers."""
RDZV_ROUND = "KIT_RDZV_ROUND"
"""The kit rendezvous' round the workers were started in: their key scope in the shared store (in-place)."""
REJOIN = "KIT_REJOIN"
"""Set for a worker its shim started again in place: it joins its peers' in-process restart."""
STACKS_DIR = "KIT_STACKS_DIR"
"""Where a rank writes its Python stacks when the launcher asks (training/runtime/stacks.py)."""
POD_ROOT_PID = "KIT_POD_ROOT_PID"
"""The pod's main process when no POD_NAME is set (a launcher started by hand)."""
TORCH_UNTESTED_WARNED = "KIT_TORCH_UNTESTED_WARNED"
"""Set to the torch version once a process warned that it is newer than the tested range: the launcher's
workers inherit it and stay quiet (one line per node, not one per rank)."""
