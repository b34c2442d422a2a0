"""Values: layering (defaults -> stack outputs -> overrides), parsing, and every rule's one-line error."""
# ruff: noqa: E501  (the table holds exact one-line messages; splitting them hides what users see)

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fsdpkit.k8s.outputs import OutputsError, load_stack_outputs, merge_stack_outputs
from fsdpkit.k8s.values import ValuesError, advice, build_values, shm_gib, staging_gib

pytestmark = pytest.mark.filterwarnings("error")

LOCAL = ["PROFILE=local", "RUN_ID=t"]
P5 = ["RUN_ID=t", "IMAGE=repo/kit:1", "FSX_PVC=fsx"]

# (overrides, exact error). Each row breaks one rule; the message names the key, the value and the fix.
ELASTIC_BAD = (
    "must be 1 to NODES=4 (the fewest nodes the job goes on with); leave it unset to train on exactly NODES"
)
BAD_VALUES = [
    (["NODES=0", *LOCAL], "NODES=0: must be at least 1"),
    (["NODES=4", "MIN_NODES=5", *LOCAL], f"MIN_NODES=5: {ELASTIC_BAD}"),
    (["NODES=4", "MIN_NODES=0", *LOCAL], f"MIN_NODES=0: {ELASTIC_BAD}"),
    (["NODES=4", "MIN_NODES=-1", *LOCAL], f"MIN_NODES=-1: {ELASTIC_BAD}"),
    (["NODES=4", "MIN_NODES=nan", *LOCAL], "MIN_NODES='nan': not a whole number"),
    (["NODES=4", "MIN_NODES=3", "ELASTIC_WAIT_S=inf", *LOCAL], "ELASTIC_WAIT_S='inf': not a whole number"),
    (["NODES=4", "MIN_NODES=3", "ELASTIC_WAIT_S=0", *LOCAL], "ELASTIC_WAIT_S=0: must be 1 to 604800 seconds"),
    (
        ["NODES=4", "MIN_NODES=3", "ELASTIC_WAIT_S=600", *LOCAL],
        "ELASTIC_WAIT_S=600: must be below REPLACEMENT_WAIT_S=600: the survivors give up after that",
    ),
    (
        ["NODES=4", "MIN_NODES=3", "LAUNCHER=torchrun", *LOCAL],
        "MIN_NODES=3: elastic training needs LAUNCHER=kit (torchrun keeps NODES)",
    ),
    (
        ["NODES=4", "MIN_NODES=3", "BATCH_SIZE=2", *LOCAL],
        "MIN_NODES=3: the global batch 8 (NODES x processes x BATCH_SIZE x grad_accum_steps) cannot be split exactly over 3 node(s) of 1 process(es) x 2 samples (node counts from MIN_NODES to NODES that can: 4): set TRAIN.training.global_batch=24 (every count from 3 to 4), or raise MIN_NODES",
    ),
    *[
        (
            ["NODES=4", "MIN_NODES=3", f"TRAIN.training.global_batch={raw}", *LOCAL],
            f"TRAIN.training.global_batch={shown}: must be a whole number, at least 0",
        )
        for raw, shown in (("12.5", "12.5"), ("-12", "-12"), ("twelve", "twelve"), ("true", "True"))
    ],
    (
        ["NODES=4", "MIN_NODES=3", "TRAIN.training.grad_accum_steps=0", *LOCAL],
        "TRAIN.training.grad_accum_steps=0: must be a whole number, at least 1",
    ),
    (
        ["NODES=4", "BATCH_SIZE=2", "TRAIN.training.global_batch=12", *LOCAL],
        "TRAIN.training.global_batch=12: cannot be split exactly over 4 node(s) x 1 process(es) x 2 samples: use a multiple of 8",
    ),
    (
        ["NODES=4", "MIN_NODES=2", "ENTRYPOINT=python train.py", *LOCAL],
        "MIN_NODES=2: with ENTRYPOINT, set TRAIN.training.global_batch (samples per optimizer step): your script splits it with fsdpkit.resilience.plan_batch on whatever number of nodes is left",
    ),
    (["NODES=four", *LOCAL], "NODES='four': not a whole number"),
    (["NODES=1e3", *LOCAL], "NODES='1e3': not a whole number"),
    (["NODES=99999999999", *LOCAL], "NODES='99999999999': must be at most 2147483647"),
    (["MONITOR_INTERVAL_S=nan", *LOCAL], "MONITOR_INTERVAL_S='nan': must be a finite number"),
    (["HEARTBEAT_LOAD_TIMEOUT_S=inf", *LOCAL], "HEARTBEAT_LOAD_TIMEOUT_S='inf': must be a finite number"),
    (["HEARTBEAT_TIMEOUT=nan", *LOCAL], "HEARTBEAT_TIMEOUT=nan: must be auto or a number of seconds above 0"),
    (["NODES=4", "NODES=5", *LOCAL], "NODES is given twice (NODES=4, then NODES=5); give each key once"),
    (["NODES=4", "nodes=4", *LOCAL], "nodes is given twice (NODES=4, then nodes=4); give each key once"),
    (
        ["ENV.FOO=1", "ENV.FOO=2", *LOCAL],
        "ENV.FOO is given twice (ENV.FOO=1, then ENV.FOO=2); give each key once",
    ),
    (
        ["TRAIN.optim.lr=1", "train.optim.lr=2", *LOCAL],
        "train.optim.lr is given twice (TRAIN.optim.lr=1, then train.optim.lr=2); give each key once",
    ),
    (["TRAIN.optim.lr=nan", *LOCAL], "TRAIN.optim.lr='nan': must be a finite number"),
    (["INPROCESS=y", *LOCAL], "INPROCESS='y': not a boolean; use one of 1/true/yes/on or 0/false/no/off"),
    (
        ["DETERMINISTIC=maybe", *LOCAL],
        "DETERMINISTIC='maybe': not a boolean; use one of 1/true/yes/on or 0/false/no/off",
    ),
    (
        [f"NODE_SELECTOR.{'k' * 70}=x", *LOCAL],
        f"NODE_SELECTOR.{'k' * 70}=x: the label key has a name part of 70 characters (at most 63); must be a "
        "qualified name: an optional DNS-subdomain prefix (at most 253) and '/', then a name of at most 63 "
        "characters, [A-Za-z0-9] at both ends and '-', '_', '.' inside",
    ),
    (
        [f"NODE_SELECTOR.{'a' * 254}/role=x", *LOCAL],
        f"NODE_SELECTOR.{'a' * 254}/role=x: the label key has a prefix of 254 characters (at most 253); must be "
        "a qualified name: an optional DNS-subdomain prefix (at most 253) and '/', then a name of at most 63 "
        "characters, [A-Za-z0-9] at both ends and '-', '_', '.' inside",
    ),
    (
        ["NODE_SELECTOR.Bad_Prefix/role=x", *LOCAL],
        "NODE_SELECTOR.Bad_Prefix/role=x: the label key has a prefix 'Bad_Prefix' that is not a DNS-1123 "
        "subdomain; must be a qualified name: an optional DNS-subdomain prefix (at most 253) and '/', then a "
        "name of at most 63 characters, [A-Za-z0-9] at both ends and '-', '_', '.' inside",
    ),
    (
        ["NODE_SELECTOR.-role=x", *LOCAL],
        "NODE_SELECTOR.-role=x: the label key must be a qualified name: an optional DNS-subdomain prefix (at "
        "most 253) and '/', then a name of at most 63 characters, [A-Za-z0-9] at both ends and '-', '_', '.' "
        "inside",
    ),
    (
        ["NODE_SELECTOR.a/b/c=x", *LOCAL],
        "NODE_SELECTOR.a/b/c=x: the label key has more than one '/'; must be a qualified name: an optional "
        "DNS-subdomain prefix (at most 253) and '/', then a name of at most 63 characters, [A-Za-z0-9] at both "
        "ends and '-', '_', '.' inside",
    ),
    (
        [f"NODE_SELECTOR.role={'v' * 64}", *LOCAL],
        f"NODE_SELECTOR.role={'v' * 64}: the label value is 64 characters (at most 63); must be empty, or at "
        "most 63 characters with [A-Za-z0-9] at both ends and '-', '_', '.' inside",
    ),
    (
        ["NODE_SELECTOR.role=gpu_", *LOCAL],
        "NODE_SELECTOR.role=gpu_: the label value must be empty, or at most 63 characters with [A-Za-z0-9] at "
        "both ends and '-', '_', '.' inside",
    ),
    (
        ["KUEUE_QUEUE=Team_Q", *LOCAL],
        "KUEUE_QUEUE=Team_Q: the Kueue queue name (a label value and a LocalQueue name) must be a DNS-1123 "
        "subdomain: at most 253 characters, dot-separated DNS-1123 labels (lower-case letters, digits, '-')",
    ),
    (
        [f"KUEUE_QUEUE={'q' * 64}", *LOCAL],
        f"KUEUE_QUEUE={'q' * 64}: the Kueue queue name (a label value and a LocalQueue name) is 64 characters "
        "(at most 63); must be empty, or at most 63 characters with [A-Za-z0-9] at both ends and '-', '_', '.' "
        "inside",
    ),
    (
        ["PRIORITY_CLASS=High", *LOCAL],
        "PRIORITY_CLASS=High: a PriorityClass name must be a DNS-1123 subdomain: at most 253 characters, "
        "dot-separated DNS-1123 labels (lower-case letters, digits, '-')",
    ),
    (
        ["SERVICE_ACCOUNT=Trainer", *LOCAL],
        "SERVICE_ACCOUNT=Trainer: the ServiceAccount name must be a DNS-1123 subdomain: at most 253 characters, "
        "dot-separated DNS-1123 labels (lower-case letters, digits, '-')",
    ),
    (
        ["FSX_PVC=My_Claim", *LOCAL],
        "FSX_PVC=My_Claim: the PVC name must be a DNS-1123 subdomain: at most 253 characters, dot-separated "
        "DNS-1123 labels (lower-case letters, digits, '-')",
    ),
    (
        ["KUBERNETES_VERSION=1.28", *LOCAL],
        "KUBERNETES_VERSION=1.28: is not supported; the kit's Job needs 1.29 or newer and its schemas are "
        "bundled up to 1.37: use one of 1.29 to 1.37",
    ),
    (["NODEZ=4", *LOCAL], "unknown value NODEZ; did you mean NODES?"),
    (["PROFILE=p6", "RUN_ID=t"], "PROFILE='p6' is not one of p5, p4d, g5, local"),
    (["LAUNCHER=mpirun", *LOCAL], "LAUNCHER='mpirun' is not one of kit, ft_launcher, torchrun"),
    (
        ["RUN_ID=My_Run", "PROFILE=local"],
        "RUN_ID=My_Run: must be lower-case letters, digits and '-', start with a letter, end with a letter or "
        "digit, at most 48 characters (e.g. llama-4n-async)",
    ),
    (
        ["RUN_ID=1run", "PROFILE=local"],
        "RUN_ID=1run: must be lower-case letters, digits and '-', start with a letter, end with a letter or "
        "digit, at most 48 characters (e.g. llama-4n-async)",
    ),
    (
        [f"RUN_ID={'a' * 49}", "PROFILE=local"],
        f"RUN_ID={'a' * 49}: must be lower-case letters, digits and '-', start with a letter, end with a letter "
        "or digit, at most 48 characters (e.g. llama-4n-async)",
    ),
    (
        ["NAMESPACE=Team_A", *LOCAL],
        "NAMESPACE=Team_A: the namespace must be a DNS-1123 label: at most 63 lower-case letters, digits and '-', "
        "alphanumeric at both ends",
    ),
    (
        ["GPUS_PER_NODE=4", *P5],
        "GPUS_PER_NODE=4: p5.48xlarge has 8 GPUs and the kit runs one pod per node; remove GPUS_PER_NODE or pick "
        "another PROFILE",
    ),
    (
        ["EFA_PER_NODE=4", *P5],
        "EFA_PER_NODE=4: p5.48xlarge has 32 EFA devices; remove EFA_PER_NODE or pick another PROFILE",
    ),
    (["PROCS_PER_NODE=4", *P5], "PROCS_PER_NODE=4: must equal the 8 GPUs of p5.48xlarge (one rank per GPU)"),
    (
        ["RUN_ID=t", "FSX_PVC=fsx"],
        "IMAGE='': an EKS profile needs the trainer image; pass OUTPUTS=cdk-outputs.json (EcrRepositoryUri) or "
        "IMAGE=<uri:tag> (make image builds it)",
    ),
    (
        ["RUN_ID=t", "IMAGE=repo/kit:1"],
        "FSX_FILE_SYSTEM_ID='': the FSx volume needs the stack outputs FsxFileSystemId, FsxDnsName and "
        "FsxMountName (or FSX_PVC=<existing claim>)",
    ),
    (
        ["ENV.MASTER_ADDR=10.0.0.1", *LOCAL],
        "ENV.MASTER_ADDR=10.0.0.1: is set by the kit or the launcher from the other values; remove it",
    ),
    (
        ["ENV.WORLD_SIZE=16", *LOCAL],
        "ENV.WORLD_SIZE=16: is set by the kit or the launcher from the other values; remove it",
    ),
    (
        ["ENV.TORCHELASTIC_RESTART_COUNT=1", *LOCAL],
        "ENV.TORCHELASTIC_RESTART_COUNT=1: is set by the kit or the launcher from the other values; remove it",
    ),
    (
        ["ENV.HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz", *LOCAL],
        "ENV.HF_TOKEN=<redacted>: looks like a secret; mount it from a Kubernetes Secret instead",
    ),
    (["ENV.9BAD=1", *LOCAL], "ENV.9BAD=1: is not a valid environment variable name"),
    (
        ["FAULT_SPEC=kill:step=5:rank=2", "NODES=2", *LOCAL],
        "FAULT_SPEC=kill:step=5:rank=2: rank=2 does not exist: the world size is 2 (2 nodes x 1 processes)",
    ),
    (
        ["FAULT_SPEC=explode:step=5:rank=1", *LOCAL],
        "FAULT_SPEC=explode:step=5:rank=1: 'explode:step=5:rank=1' is not KIND:step=N:rank=R or "
        "KIND:time=SECONDS:rank=R (KIND kill, hang, sigstop, exception or oom), slow:step=N:rank=R:factor=F, "
        "nor node|freeze|drain:step=N:node=K",
    ),
    (
        ["FAULT_SPEC=kill:step=50:rank=1", "STEPS=40", *LOCAL],
        "FAULT_SPEC=kill:step=50:rank=1: step=50 is after the last step (40)",
    ),
    (
        ["FAULT_SCHEDULE_SEED=42", "NODES=1", *LOCAL],
        "FAULT_SCHEDULE_SEED=42: the schedule never faults rank 0, so it needs a world size of 2 or more",
    ),
    (
        ["CHECKPOINT_KEEP=1", *LOCAL],
        "CHECKPOINT_KEEP=1: must be at least 2 (the newest may still be in flight)",
    ),
    (
        ["CHECKPOINT_INTERVAL=50", "STEPS=40", *LOCAL],
        "CHECKPOINT_INTERVAL=50: is beyond the last step (40); no checkpoint would be written",
    ),
    (
        ["CHECKPOINT_MODE=off", "CHECKPOINT_INTERVAL=5", *LOCAL],
        "CHECKPOINT_INTERVAL=5: is set but CHECKPOINT_MODE=off; remove one of them",
    ),
    (
        ["CHECKPOINT_MODE=off", "CHECKPOINT_INTERVAL=auto", *LOCAL],
        "CHECKPOINT_INTERVAL=auto: is set but CHECKPOINT_MODE=off; remove one of them",
    ),
    (["CHECKPOINT_INTERVAL=soon", *LOCAL], "CHECKPOINT_INTERVAL='soon': not a whole number (or auto)"),
    (["CHECKPOINT_INTERVAL=Auto", *LOCAL], "CHECKPOINT_INTERVAL='Auto': not a whole number (or auto)"),
    (["CHECKPOINT_INTERVAL=0", *LOCAL], "CHECKPOINT_INTERVAL=0: must be at least 1"),
    (
        ["HEARTBEAT_TIMEOUT=soon", *LOCAL],
        "HEARTBEAT_TIMEOUT=soon: must be auto or a number of seconds above 0",
    ),
    (
        ["HEARTBEAT_TIMEOUT=1", *LOCAL],
        "HEARTBEAT_TIMEOUT=1: must be above twice MONITOR_INTERVAL_S (0.5) or no beat can be seen in time",
    ),
    (
        ["HEARTBEAT_TIMEOUT=600", "HEARTBEAT_LOAD_TIMEOUT_S=300", *LOCAL],
        "HEARTBEAT_LOAD_TIMEOUT_S=300.0: must be at least HEARTBEAT_TIMEOUT (600): starting and loading a "
        "checkpoint take longer than a step",
    ),
    (
        ["INPROCESS=1", "HEARTBEAT_TIMEOUT=60", "INPROCESS_BARRIER_TIMEOUT_S=90", *LOCAL],
        "INPROCESS_BARRIER_TIMEOUT_S=90.0: must be below HEARTBEAT_TIMEOUT (60) so an in-process restart finishes "
        "before the launcher declares a hang",
    ),
    (
        ["LAUNCHER=ft_launcher", "INPROCESS=1", "INPROCESS_BARRIER_TIMEOUT_S=1000", *LOCAL],
        "INPROCESS_BARRIER_TIMEOUT_S=1000.0: must be below HEARTBEAT_TIMEOUT (900) so an in-process restart "
        "finishes before the launcher declares a hang",
    ),
    (
        ["LAUNCHER=torchrun", "INPROCESS=yes", "MAX_RESTARTS=3", *LOCAL],
        "MAX_RESTARTS=3: torchrun kills every worker when one dies, so in-process restart cannot work under its "
        "restarts (NVRx guide); use MAX_RESTARTS=0 or LAUNCHER=kit",
    ),
    (
        ["LAUNCHER=torchrun", "HEARTBEAT_TIMEOUT=60", *LOCAL],
        "HEARTBEAT_TIMEOUT=60: torchrun has no heartbeat; remove it or use LAUNCHER=kit",
    ),
    (
        ["INPROCESS=maybe", *LOCAL],
        "INPROCESS='maybe': not a boolean; use one of 1/true/yes/on or 0/false/no/off",
    ),
    (
        ["INPROCESS=1", "ENV.TORCH_NCCL_RETHROW_CUDA_ERRORS=1", *LOCAL],
        "ENV.TORCH_NCCL_RETHROW_CUDA_ERRORS=1: must be 0 with INPROCESS=1 (NVRx in-process guide); remove it",
    ),
    (
        ["ENV.NCCL_NVLS_ENABLE=1", *LOCAL],
        "ENV.NCCL_NVLS_ENABLE=1: must stay 0 (NVLS breaks restarts); remove it",
    ),
    (
        ["SHM_GIB=40", "NODES=1", *P5],
        "SHM_GIB=40: is below the 89.7 GiB one node stages per async checkpoint; raise SHM_GIB or use more NODES",
    ),
    (
        ["SHM_GIB=1000", *P5],
        "SHM_GIB=1000: is more than half the pod's 1800 GiB memory (the shm counts against it)",
    ),
    (["HUGEPAGES_2MI_MIB=5121", *P5], "HUGEPAGES_2MI_MIB=5121: must be a multiple of 2 (2 MiB pages)"),
    (
        ["HUGEPAGES_2MI_MIB=512", *LOCAL],
        "HUGEPAGES_2MI_MIB=512: hugepages are for EFA nodes; remove it on PROFILE=local",
    ),
    (["DATA_KIND=shards", *LOCAL], "DATA_PATH='': must be a folder under /fsx/ for data_kind=shards"),
    (
        ["DATA_KIND=shards", "DATA_PATH=/fsx/runs/c4", *LOCAL],
        "DATA_PATH=/fsx/runs/c4: must be outside /fsx/runs/ (run folders are never shared)",
    ),
    (
        ["DATA_PATH=/fsx/data/c4", *LOCAL],
        "DATA_PATH=/fsx/data/c4: is only used with DATA_KIND=shards; remove it or set DATA_KIND=shards",
    ),
    (
        ["RDZV_PORT=80", *LOCAL],
        "RDZV_PORT=80: must be between 1024 and 65533 (the next two ports are used too)",
    ),
    (
        ["KUBERNETES_VERSION=v1.35", *LOCAL],
        "KUBERNETES_VERSION=v1.35: must be MAJOR.MINOR, e.g. 1.37; supported: 1.29 to 1.37",
    ),
    (["NCCL_DEBUG=LOUD", *LOCAL], "NCCL_DEBUG=LOUD: must be VERSION, WARN, INFO or TRACE"),
    (
        ["GPU_NODE_TAINT=gpu", *LOCAL],
        "GPU_NODE_TAINT=gpu: must be key=value:Effect (NoSchedule, PreferNoSchedule, NoExecute)",
    ),
    (
        ["TRAIN.optimizer.lr=0.9", *LOCAL],
        "TRAIN.optimizer.lr is not a trainer config field; sections: run, model, data, optim, training, "
        "parallel, checkpoint, fault, inprocess, straggler (fields as in the trainer's config, e.g. "
        "TRAIN.optim.lr=1e-4)",
    ),
    (
        ["TRAIN.checkpoint.mode=sync", *LOCAL],
        "TRAIN.checkpoint.mode has its own value; set CHECKPOINT_MODE=sync instead",
    ),
    (["NODES", *LOCAL], "override 'NODES' is not KEY=VALUE; e.g. NODES=4 or ENV.NCCL_DEBUG=INFO"),
    (["SPARES=-1", *LOCAL], "SPARES=-1: must be 0 or more"),
    (
        ["SPARES=1", "LAUNCHER=torchrun", *LOCAL],
        "SPARES=1: hot spares need LAUNCHER=kit (torchrun is a "
        "baseline and keeps its own set-up); use SPARES=0 or LAUNCHER=kit",
    ),
    (["REPLACEMENT_WAIT_S=0", *LOCAL], "REPLACEMENT_WAIT_S=0: must be 1 to 604800 seconds"),
    (["REPLACEMENT_WAIT_S=604801", *LOCAL], "REPLACEMENT_WAIT_S=604801: must be 1 to 604800 seconds"),
    (["RDZV_KEEP_ALIVE_S=nan", *LOCAL], "RDZV_KEEP_ALIVE_S='nan': must be a finite number"),
    (
        ["RDZV_KEEP_ALIVE_S=0", *LOCAL],
        "RDZV_KEEP_ALIVE_S=0.0: must be between 0.1 and 60 seconds (faster beats of many nodes swamp the store)",
    ),
    (
        ["RDZV_KEEP_ALIVE_S=1e9", *LOCAL],
        "RDZV_KEEP_ALIVE_S=1000000000.0: must be between 0.1 and 60 seconds (faster beats of many nodes swamp the store)",
    ),
    (["RDZV_KEEP_ALIVE_ATTEMPTS=1", *LOCAL], "RDZV_KEEP_ALIVE_ATTEMPTS=1: must be between 2 and 100"),
    (
        ["RDZV_KEEP_ALIVE_S=0.2", "RDZV_KEEP_ALIVE_ATTEMPTS=5", *LOCAL],
        "RDZV_KEEP_ALIVE_ATTEMPTS=5: (RDZV_KEEP_ALIVE_ATTEMPTS - 1) x RDZV_KEEP_ALIVE_S (0.2) must be at least 1 s, "
        "or a live node whose keep-alive stalls that long (a busy node, a slow store) is dropped and the group "
        "restarts (e.g. 0.1 x 12)",
    ),
    (["NODE_FAILURE_LIMIT=-2", *LOCAL], "NODE_FAILURE_LIMIT=-2: must be 0 (never give a node up) or more"),
    (["CHECKPOINT_WRITE_MIB_S=0", *LOCAL], "CHECKPOINT_WRITE_MIB_S=0.0: must be above 0 MiB/s"),
    (
        ["TERMINATION_GRACE_S=5", *LOCAL],
        "TERMINATION_GRACE_S=5: is too short to drain: the job must finish a save in flight and write one "
        "more checkpoint (0.02 GiB at CHECKPOINT_WRITE_MIB_S=1000) and commit it before the pod is killed; "
        "use at least 31, or leave it unset",
    ),
    (
        ["FAULT_SPEC=node:step=3:node=3", "SPARES=1", *LOCAL],
        "FAULT_SPEC=node:step=3:node=3: node=3 does not exist: the Job has 3 pods (2 nodes + 1 spares), "
        "indexes 0-2",
    ),
    (
        ["IMAGE=PLACEHOLDER.invalid/kit:1", "RUN_ID=t", "FSX_PVC=fsx"],
        "IMAGE=PLACEHOLDER.invalid/kit:1: is a dry-run placeholder; deploy first or set it explicitly",
    ),
]


@pytest.mark.parametrize(
    ("overrides", "message"),
    BAD_VALUES,
    ids=[m.split(":")[0].split("=")[0] + f"-{i}" for i, (_, m) in enumerate(BAD_VALUES)],
)
def test_k8s_bad_value_has_its_one_line_error(overrides: list[str], message: str) -> None:
    with pytest.raises(ValuesError) as err:
        build_values(overrides=overrides)
    assert str(err.value) == message
    assert "\n" not in str(err.value)


def test_k8s_profile_mismatch_with_the_node_group(stack_outputs: dict) -> None:
    outputs = merge_stack_outputs(stack_outputs)
    with pytest.raises(
        ValuesError, match=r"^PROFILE=g5: expects g5.8xlarge but the GPU node group runs p5.48xlarge"
    ):
        build_values(outputs=outputs, overrides=["PROFILE=g5", "RUN_ID=t"])


def test_k8s_nodes_beyond_the_node_group(stack_outputs: dict) -> None:
    outputs = merge_stack_outputs(stack_outputs)
    with pytest.raises(
        ValuesError, match=r"^NODES=5: the GPU node group has 4 nodes; ask for at most that many"
    ):
        build_values(outputs=outputs, overrides=["NODES=5", "RUN_ID=t"])


def test_k8s_capacity_safe_stack_bounds_by_its_maximum_and_warns_about_idle_nodes(
    stack_outputs: dict,
) -> None:
    """infra's default GPU group runs 0 nodes (GpuNodeCount=0) and may scale to GpuMaxNodes."""
    stack_outputs["Kit-Cluster"] |= {"GpuNodeCount": "0", "GpuMaxNodes": "4"}
    outputs = merge_stack_outputs(stack_outputs)
    values = build_values(outputs=outputs, overrides=["RUN_ID=t", "NODES=2"])
    (note,) = [n for n in advice(values) if "GpuNodeCount" in n]
    assert note.startswith("NODES=2: the GPU node group runs 0 nodes now") and "gpu.desired_nodes=2" in note
    assert build_values(outputs=outputs, overrides=["RUN_ID=t"]).nodes == 2  # 0 running: the default 2
    with pytest.raises(ValuesError, match=r"^NODES=5: the GPU node group may scale to 4 nodes"):
        build_values(outputs=outputs, overrides=["NODES=5", "RUN_ID=t"])


def test_k8s_layers_defaults_then_outputs_then_overrides(stack_outputs: dict) -> None:
    outputs = merge_stack_outputs(stack_outputs)
    from_outputs = build_values(outputs=outputs, overrides=["RUN_ID=t"])
    assert from_outputs.profile == "p5"  # GpuInstanceType p5.48xlarge
    assert from_outputs.nodes == 4  # GpuNodeCount
    assert from_outputs.image == "123456789012.dkr.ecr.us-east-2.amazonaws.com/kit-trainer:latest"
    assert from_outputs.node_selector == {"role": "gpu-train", "vpc.amazonaws.com/efa.present": "true"}
    assert from_outputs.fsx_file_system_id == "fs-0123456789abcdef0"
    overridden = build_values(
        outputs=outputs, overrides=["RUN_ID=t", "NODES=2", "IMAGE_TAG=v7", "model=small"]
    )
    assert (overridden.nodes, overridden.image, overridden.model) == (
        2,
        "123456789012.dkr.ecr.us-east-2.amazonaws.com/kit-trainer:v7",
        "small",
    )
    explicit = build_values(outputs=outputs, overrides=["RUN_ID=t", "IMAGE=registry.example/kit:abc"])
    assert explicit.image == "registry.example/kit:abc"
    defaults = build_values(overrides=["RUN_ID=t", "PROFILE=local"])
    assert (defaults.nodes, defaults.model, defaults.checkpoint_mode) == (2, None, "async")


def test_k8s_override_keys_are_case_and_dash_insensitive() -> None:
    v = build_values(overrides=["profile=local", "run-id=mixed-case", "Checkpoint-Mode=sync"])
    assert (v.run_id, v.checkpoint_mode, v.profile) == ("mixed-case", "sync", "local")
    with pytest.raises(ValuesError, match=r"^RUN_ID is given twice \(run-id=mixed-case, then RUN_ID=t2\)"):
        build_values(overrides=["profile=local", "run-id=mixed-case", "RUN_ID=t2"])


def test_k8s_run_id_is_generated_when_missing() -> None:
    from datetime import UTC, datetime

    v = build_values(overrides=["PROFILE=local"], now=datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC))
    assert v.run_id == "kit-20260304-050607"


def test_k8s_dry_run_placeholders_are_marked_and_refused_for_apply() -> None:
    v = build_values(overrides=["RUN_ID=t"], allow_placeholders=True)
    assert v.image.startswith("PLACEHOLDER") and v.fsx_file_system_id == "PLACEHOLDER-fsx-id"
    with pytest.raises(ValuesError, match=r"^IMAGE='': an EKS profile needs the trainer image"):
        build_values(overrides=["RUN_ID=t"])


def test_k8s_shm_is_sized_for_async_staging() -> None:
    one = build_values(overrides=[*P5, "NODES=1"])
    four = build_values(overrides=[*P5, "NODES=4"])
    assert staging_gib(one) == pytest.approx(8.03e9 * 12 / 2**30)
    # one node: local tiers, 2 x 89.7 GiB; four: peer tiers, 4 x 22.4 GiB (the kept step and the one being
    # written, the node's own and its buddy's)
    assert shm_gib(one) == 180 and shm_gib(four) == 90
    assert shm_gib(build_values(overrides=[*P5, "NODES=4", "CHECKPOINT_TIERS=off"])) == 64  # p5's floor
    assert shm_gib(build_values(overrides=[*P5, "SHM_GIB=100"])) == 100


def test_k8s_outputs_missing_key_is_one_line(tmp_path: Path, stack_outputs: dict) -> None:
    del stack_outputs["Kit-Storage"]["FsxMountName"]
    path = tmp_path / "out.json"
    path.write_text(json.dumps(stack_outputs))
    with pytest.raises(OutputsError) as err:
        load_stack_outputs(path)
    assert str(err.value) == (
        f"{path}: missing output FsxMountName; redeploy with 'make deploy' (it writes every output) or pass the "
        "value on the command line"
    )


def test_k8s_outputs_conflict_and_shape(stack_outputs: dict, tmp_path: Path) -> None:
    stack_outputs["Kit-Storage"]["Region"] = "eu-west-1"
    with pytest.raises(
        OutputsError, match=r"output Region differs between stacks Kit-Cluster \('us-east-2'\)"
    ):
        merge_stack_outputs(stack_outputs)
    with pytest.raises(OutputsError, match=r"expected \{stack name: \{output: value\}\}"):
        merge_stack_outputs({"ClusterName": "x"})
    with pytest.raises(OutputsError, match=r"not found; run 'make deploy' first"):
        load_stack_outputs(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(OutputsError, match=r"is not valid JSON"):
        load_stack_outputs(bad)


def test_k8s_outputs_with_unknown_instance_type(stack_outputs: dict) -> None:
    stack_outputs["Kit-Cluster"]["GpuInstanceType"] = "p6-b200.48xlarge"
    with pytest.raises(
        ValuesError, match=r"^GpuInstanceType='p6-b200.48xlarge' has no k8s profile; supported"
    ):
        build_values(outputs=merge_stack_outputs(stack_outputs), overrides=["RUN_ID=t"])


def test_k8s_outputs_labels_must_be_a_json_object(stack_outputs: dict) -> None:
    stack_outputs["Kit-Cluster"]["GpuNodeLabels"] = "role=gpu"
    with pytest.raises(
        ValuesError, match=r"^stack output GpuNodeLabels='role=gpu' is not a JSON object; redeploy"
    ):
        build_values(outputs=merge_stack_outputs(stack_outputs), overrides=["RUN_ID=t"])


def test_k8s_train_section_overrides_reach_the_config() -> None:
    v = build_values(
        overrides=[*LOCAL, "TRAIN.optim.lr=3e-4", "TRAIN.optim.warmup_steps=5", "TRAIN.data.x=on"]
    )
    assert v.train == {"optim": {"lr": 3e-4, "warmup_steps": 5}, "data": {"x": "on"}}


def test_k8s_cdk_made_claim_sets_the_namespace(stack_outputs: dict) -> None:
    stack_outputs["Kit-Cluster"].update(FsxPvcName="fsx-pvc", FsxPvcNamespace="training")
    outputs = merge_stack_outputs(stack_outputs)
    v = build_values(outputs=outputs, overrides=["RUN_ID=t"])
    assert (v.namespace, v.fsx_pvc, v.fsx_storage_gib) == ("training", "fsx-pvc", 2400)
    with pytest.raises(ValuesError) as err:
        build_values(outputs=outputs, overrides=["RUN_ID=t", "NAMESPACE=other"])
    assert str(err.value) == (
        "NAMESPACE=other: the FSx claim fsx-pvc lives in namespace training; use NAMESPACE=training (a pod can "
        "mount only claims of its own namespace)"
    )


def test_k8s_outputs_device_counts_must_match_the_profile(stack_outputs: dict) -> None:
    stack_outputs["Kit-Cluster"]["EfaDevicesPerNode"] = "16"
    with pytest.raises(ValuesError, match=r"^EFA_PER_NODE=16: p5.48xlarge has 32 EFA devices"):
        build_values(outputs=merge_stack_outputs(stack_outputs), overrides=["RUN_ID=t"])


def test_k8s_an_elastic_job_renders_min_max_nodes_its_wait_and_its_global_batch() -> None:
    """MIN_NODES=3 of 4: the launcher's --nnodes 3:4 and last call, the trainer's global batch (the config's
    product, 4 x 1 x 1 x 3 = 12, kept at 3 nodes: 4 micro-batches each) instead of the accumulation."""
    from fsdpkit.k8s.elastic import nnodes
    from fsdpkit.k8s.spec import launcher_command, trainer_config

    v = build_values(
        overrides=[
            "NODES=4",
            "MIN_NODES=3",
            "ELASTIC_WAIT_S=5",
            "BATCH_SIZE=1",
            "TRAIN.training.grad_accum_steps=3",
            *LOCAL,
        ]
    )
    assert nnodes(v) == "3:4"
    cmd = launcher_command(v, endpoint_host="h", config_path="/c.yaml", run_dir="/r")
    assert "--nnodes=3:4" in cmd
    assert any(a.startswith("--rdzv-conf=") and a.endswith(",last_call_timeout=5") for a in cmd)
    training = trainer_config(v)["training"]
    assert training["global_batch"] == 12 and "grad_accum_steps" not in training
    fixed = build_values(overrides=["NODES=4", "MIN_NODES=4", *LOCAL])  # as many as NODES: a fixed job
    assert nnodes(fixed) == "4" and "global_batch" not in trainer_config(fixed).get("training", {})


def test_k8s_an_hsdp_job_restarts_a_crashed_rank_in_place_and_an_elastic_one_keeps_its_shard_group() -> None:
    """TRAIN.parallel.replicate with in-process restart: the launcher's --rank-restart in-place and the
    trainer's `parallel` section; an elastic job may not fix the replica count (its world size changes)."""
    from fsdpkit.k8s.spec import launcher_command, trainer_config

    def command(*overrides: str) -> list[str]:
        v = build_values(overrides=["NODES=2", *overrides, *LOCAL])
        return launcher_command(v, endpoint_host="h", config_path="/c.yaml", run_dir="/r")

    hsdp = ["TRAIN.parallel.replicate=2", "INPROCESS=true"]
    assert "--rank-restart=in-place" in command(*hsdp)
    assert "--rank-restart=in-place" not in command("INPROCESS=true")  # FSDP: no replica to restore from
    assert "--rank-restart=in-place" not in command("TRAIN.parallel.replicate=2")  # nothing to rejoin
    v = build_values(overrides=["NODES=2", *hsdp, *LOCAL])
    assert trainer_config(v)["parallel"] == {"replicate": 2}
    elastic = ["NODES=4", "MIN_NODES=2", "TRAIN.training.global_batch=96", *LOCAL]
    with pytest.raises(
        ValuesError, match=r"^TRAIN\.parallel\.replicate=2: cannot be fixed in an elastic job"
    ):
        build_values(overrides=[*elastic, "TRAIN.parallel.replicate=2"])
    kept = build_values(overrides=[*elastic, "TRAIN.parallel.replicate=auto", "TRAIN.parallel.shard=1"])
    assert trainer_config(kept)["parallel"] == {"replicate": "auto", "shard": 1}
