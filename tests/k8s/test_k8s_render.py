"""Rendering: every profile and variant is schema-valid on three Kubernetes versions and passes the kit's
policy; rank discovery for 1-8 nodes; one test per value, asserted by path; golden files for p5."""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from fsdpkit.k8s.local import LocalRunner, load_job
from fsdpkit.k8s.outputs import merge_stack_outputs
from fsdpkit.k8s.render import Manifest, environment, render, write
from fsdpkit.k8s.spec import POD_WRAPPER, PROGRAM_WRAPPER, WORKER_WRAPPER
from fsdpkit.k8s.validate import SCHEMA_VERSIONS, ManifestError, policy_problems, schema_problems, validate
from fsdpkit.k8s.values import build_values

GOLDEN = Path(__file__).parent / "golden" / "p5"
LOCAL = ["PROFILE=local", "RUN_ID=t"]


def _render(overrides: list[str], *, outputs: dict | None = None) -> list[Manifest]:
    return render(build_values(outputs=outputs, overrides=overrides, allow_placeholders=outputs is None))


def _with_run_id(overrides: list[str]) -> list[str]:
    """RUN_ID=t unless the row sets its own (a key may be given only once)."""
    return overrides if any(o.upper().startswith("RUN_ID=") for o in overrides) else ["RUN_ID=t", *overrides]


def _obj(manifests: list[Manifest], kind: str, *, store: bool = False) -> dict[str, Any]:
    """The first object of `kind`: the training Job's own, or (store=True) the rendezvous store's."""
    return next(
        m.obj
        for m in manifests
        if m.obj["kind"] == kind
        and (m.obj["metadata"]["labels"].get("app.kubernetes.io/component") == "rdzv-store") == store
    )


def _container(manifests: list[Manifest]) -> dict[str, Any]:
    return _obj(manifests, "Job")["spec"]["template"]["spec"]["containers"][0]


def _env(manifests: list[Manifest]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in _container(manifests)["env"]}


@pytest.mark.parametrize("launcher", ["kit", "ft_launcher", "torchrun"])
@pytest.mark.parametrize("profile", ["p5", "p4d", "g5", "local"])
def test_k8s_every_profile_and_launcher_is_valid(profile: str, launcher: str) -> None:
    manifests = _render([f"PROFILE={profile}", f"LAUNCHER={launcher}", "RUN_ID=t"])
    validate(manifests, versions=SCHEMA_VERSIONS, allow_placeholders=True)
    command = _container(manifests)["command"]
    if launcher == "kit":
        assert command[:3] == ["python", "-m", "fsdpkit.launcher"]
    else:  # torchrun and ft_launcher run inside the exit-78 wrappers
        assert command[:2] == ["sh", "-c"] and command[4] == (
            "ft_launcher" if launcher == "ft_launcher" else "python"
        )
        assert command[command.index("--no-python") + 1 : command.index("--no-python") + 3] == ["sh", "-c"]


VARIANTS = {
    "inprocess-on": ["INPROCESS=1", "INPROCESS_BACKEND=nvrx", "INPROCESS_BARRIER_TIMEOUT_S=60"],
    "inprocess-off": ["INPROCESS=0"],
    "ckpt-off": ["CHECKPOINT_MODE=off"],
    "ckpt-sync": ["CHECKPOINT_MODE=sync", "CHECKPOINT_INTERVAL=500", "STEPS=2000"],
    "ckpt-async-dcp": ["CHECKPOINT_MODE=async", "CHECKPOINT_BACKEND=dcp", "CHECKPOINT_KEEP=3"],
    "fault-spec": ["FAULT_SPEC=kill:step=20:rank=1,exception:step=45:rank=9", "STEPS=100"],
    "fault-schedule": [
        "FAULT_SCHEDULE_SEED=42",
        "FAULT_SCHEDULE_COUNT=5",
        "FAULT_SCHEDULE_KINDS=exception:0.6,hang:0.4",
    ],
    "ft-inprocess": ["LAUNCHER=ft_launcher", "INPROCESS=1", "MAX_RESTARTS=5"],
    "torchrun-baseline": ["LAUNCHER=torchrun", "CHECKPOINT_MODE=sync"],
    "hugepages-deadline": ["HUGEPAGES_2MI_MIB=5120", "ACTIVE_DEADLINE_S=7200"],
    "cdk-pvc-env": ["FSX_PVC=fsx-claim", "ENV.NCCL_DEBUG_SUBSYS=INIT,NET", "NCCL_DEBUG=INFO"],
    "shards": ["DATA_KIND=shards", "DATA_PATH=/fsx/data/c4", "SEQ_LEN=2048", "BATCH_SIZE=1"],
    "straggler-replace": ["STRAGGLER_POLICY=replace", "SPARES=1"],  # + the node-cordon ClusterRole/Binding
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_k8s_every_variant_is_valid(variant: str, stack_outputs: dict) -> None:
    outputs = merge_stack_outputs(stack_outputs)
    manifests = _render(["RUN_ID=t", "NODES=2", *VARIANTS[variant]], outputs=outputs)
    validate(manifests, versions=SCHEMA_VERSIONS)


@pytest.mark.parametrize("nodes", [1, 2, 4, 8])
def test_k8s_rank_discovery(nodes: int, tmp_path: Path) -> None:
    manifests = _render([f"NODES={nodes}", "RUN_ID=llama", "NAMESPACE=team-a"])
    job = _obj(manifests, "Job")
    env = _env(manifests)
    master = "llama-0.llama.team-a.svc.cluster.local"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == nodes
    assert (
        job["spec"]["template"]["spec"]["subdomain"]
        == _obj(manifests, "Service")["metadata"]["name"]
        == "llama"
    )
    assert env["MASTER_ADDR"] == master
    assert (env["NNODES"], env["NPROC_PER_NODE"], env["WORLD_SIZE"]) == (str(nodes), "8", str(8 * nodes))
    assert env["NODE_RANK"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
    }
    cmd = _container(manifests)["command"]
    assert f"--nnodes={nodes}" in cmd and "--nproc-per-node=8" in cmd and "--node-rank=$(NODE_RANK)" in cmd
    assert "--rdzv-endpoint=llama-rdzv.team-a.svc.cluster.local:29500" in cmd  # not pod 0: the store pod
    assert "--rdzv-conf=is_host=0,join_timeout=600,keep_alive_interval=0.1,keep_alive_max_attempt=12" in cmd
    # What each pod sees, as the kubelet would resolve the env and $(VAR)s for completion index i.
    runner = LocalRunner(load_job(_render_local(nodes)), workdir=tmp_path)
    ranks: list[int] = []
    for index in range(nodes):
        pod_env = runner.pod_env(index, f"llama-{index}-x")
        argv = runner.pod_argv(pod_env)
        assert pod_env["NODE_RANK"] == pod_env["JOB_COMPLETION_INDEX"] == str(index)
        assert pod_env["HOSTNAME"] == f"llama-{index}"
        assert pod_env["MASTER_ADDR"] == "127.0.0.1" and pod_env["WORLD_SIZE"] == str(2 * nodes)
        assert f"--node-rank={index}" in argv and f"--rdzv-endpoint=127.0.0.1:{runner.port}" in argv
        ranks += [index * 2 + local for local in range(2)]
    assert ranks == list(range(2 * nodes))


def _render_local(nodes: int) -> list[Manifest]:
    return _render(
        [f"NODES={nodes}", "RUN_ID=llama", "NAMESPACE=team-a", "PROFILE=local", "PROCS_PER_NODE=2"]
    )


# (overrides, manifest kind, path, expected): one render test per value, asserted on parsed YAML by path.
ECR_DIGEST = "123456789012.dkr.ecr.us-east-2.amazonaws.com/team/my-train:v1@sha256:" + "ab" * 32
JOB = "spec.template.spec"
C0 = f"{JOB}.containers.0"
PER_VALUE = [
    (["NODES=1"], "Job", "spec.completions", 1),
    (["NODES=3"], "Job", "spec.parallelism", 3),
    (["NAMESPACE=ml"], "Job", "metadata.namespace", "ml"),
    (["NAMESPACE=ml"], "Namespace", "metadata.name", "ml"),
    (["SERVICE_ACCOUNT=trainer"], "Job", f"{JOB}.serviceAccountName", "trainer"),
    (["SERVICE_ACCOUNT=trainer"], "ServiceAccount", "metadata.name", "trainer"),
    (["IMAGE=reg.example/kit:9"], "Job", f"{C0}.image", "reg.example/kit:9"),
    (["IMAGE=reg.example/kit:9"], "Deployment", f"{JOB}.containers.0.image", "reg.example/kit:9"),
    ([f"IMAGE={ECR_DIGEST}"], "Job", f"{C0}.image", ECR_DIGEST),
    (["ENTRYPOINT=python -m my.train"], "Job", f"{C0}.command.-2", "-m"),
    (["ENTRYPOINT=python -m my.train"], "Job", f"{C0}.command.-1", "my.train"),
    ([], "Job", f"{C0}.command.-3", "fsdpkit.trainer"),
    (["IMAGE_PULL_POLICY=Always"], "Job", f"{C0}.imagePullPolicy", "Always"),
    (["BACKOFF_LIMIT_PER_INDEX=0"], "Job", "spec.backoffLimitPerIndex", 0),
    (["BACKOFF_LIMIT_PER_INDEX=7"], "Job", "spec.backoffLimitPerIndex", 7),
    (["TTL_SECONDS_AFTER_FINISHED=0"], "Job", "spec.ttlSecondsAfterFinished", 0),
    (["ACTIVE_DEADLINE_S=3600"], "Job", "spec.activeDeadlineSeconds", 3600),
    (["TERMINATION_GRACE_S=300"], "Job", f"{JOB}.terminationGracePeriodSeconds", 300),
    (["SPARES=2"], "Job", "spec.completions", 4),
    (["SPARES=2"], "Job", "spec.parallelism", 4),
    (["SHM_GIB=100"], "Job", f"{JOB}.volumes.1.emptyDir", {"medium": "Memory", "sizeLimit": "100Gi"}),
    (["HUGEPAGES_2MI_MIB=5120"], "Job", f"{C0}.resources.limits.hugepages-2Mi", "5120Mi"),
    (["HUGEPAGES_2MI_MIB=5120"], "Job", f"{C0}.resources.requests.hugepages-2Mi", "5120Mi"),
    (["RDZV_PORT=23456"], "Service", "spec.ports.0.port", 23456),
    (["RDZV_PORT=23456"], "Job", f"{C0}.ports.2.containerPort", 23458),
    (["FSX_PVC=claim-x"], "Job", f"{JOB}.volumes.0.persistentVolumeClaim.claimName", "claim-x"),
    (["FSX_STORAGE_GIB=2400"], "PersistentVolume", "spec.capacity.storage", "2400Gi"),
    (["FSX_FILE_SYSTEM_ID=fs-1"], "PersistentVolume", "spec.csi.volumeHandle", "fs-1"),
    (["FSX_DNS_NAME=dns.example"], "PersistentVolume", "spec.csi.volumeAttributes.dnsname", "dns.example"),
    (["FSX_MOUNT_NAME=mnt1"], "PersistentVolume", "spec.csi.volumeAttributes.mountname", "mnt1"),
    (["NODE_SELECTOR.role=gpu-train"], "Job", f"{JOB}.nodeSelector", {"role": "gpu-train"}),
    ([], "Job", f"{JOB}.nodeSelector", {"node.kubernetes.io/instance-type": "p5.48xlarge"}),
    (
        ["GPU_NODE_TAINT=dedicated=train:NoSchedule"],
        "Job",
        f"{JOB}.tolerations.1",
        {"key": "dedicated", "operator": "Equal", "value": "train", "effect": "NoSchedule"},
    ),
    (
        ["GPU_NODE_TAINT=nvidia.com/gpu:NoSchedule"],
        "Job",
        f"{JOB}.tolerations",
        [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    ),
    (["PROFILE=p4d"], "Job", f"{C0}.resources.limits.vpc\u2024amazonaws\u2024com/efa", "4"),
    (["PROFILE=g5"], "Job", f"{C0}.resources.limits.nvidia\u2024com/gpu", "1"),
    (["PROFILE=local"], "Job", f"{C0}.resources.limits", {"cpu": "1", "memory": "4Gi"}),
]


def _dotted(obj: Any, path: str) -> Any:
    for part in path.split("."):
        part = part.replace("\u2024", ".")
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    return obj


@pytest.mark.parametrize(("overrides", "kind", "path", "expected"), PER_VALUE,
                         ids=[f"{o[0] if o else 'default'}:{p}" for o, _, p, _ in PER_VALUE])  # fmt: skip
def test_k8s_each_value_lands_at_its_path(overrides: list[str], kind: str, path: str, expected: Any) -> None:
    manifests = _render(["RUN_ID=t", *overrides])
    assert _dotted(_obj(manifests, kind, store=kind == "Deployment"), path) == expected


ENV_VALUES = [
    (["RUN_ID=abc"], "RUN_DIR", "/fsx/runs/abc"),
    (["NCCL_DEBUG=info"], "NCCL_DEBUG", "INFO"),
    (["ENV.NCCL_DEBUG=TRACE"], "NCCL_DEBUG", "TRACE"),  # user env beats the profile's
    (["ENV.FI_EFA_USE_DEVICE_RDMA=0"], "FI_EFA_USE_DEVICE_RDMA", "0"),
    ([], "FI_EFA_USE_DEVICE_RDMA", "1"),
    ([], "FI_PROVIDER", "efa"),
    ([], "FI_EFA_FORK_SAFE", "1"),
    ([], "NCCL_NVLS_ENABLE", "0"),
    ([], "TORCH_CPP_LOG_LEVEL", "error"),
    ([], "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"),
    (["INPROCESS=1"], "TORCH_NCCL_RETHROW_CUDA_ERRORS", "0"),
    (["PROFILE=g5"], "FI_EFA_USE_DEVICE_RDMA", None),
    (["LAUNCHER=ft_launcher"], "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None),
    (["INPROCESS=0"], "TORCH_NCCL_RETHROW_CUDA_ERRORS", None),
    (["PROFILE=local"], "FI_PROVIDER", None),
    (["RDZV_PORT=30000"], "MASTER_PORT", "30000"),
]


@pytest.mark.parametrize(("overrides", "name", "expected"), ENV_VALUES,
                         ids=[f"{o[0] if o else 'default'}:{n}" for o, n, _ in ENV_VALUES])  # fmt: skip
def test_k8s_each_env_value(overrides: list[str], name: str, expected: str | None) -> None:
    assert _env(_render(_with_run_id(overrides))).get(name) == expected


TRAINER = [
    (["RUN_ID=abc"], "run", {"id": "abc", "root": "/fsx/runs"}),
    (["SEED=7"], "run", {"id": "t", "root": "/fsx/runs", "seed": 7}),
    ([], "model", {"name": "llama3.1-8b", "activation_checkpointing": "full"}),
    ([], "data", {"kind": "synthetic", "seq_len": 8192, "batch_size": 1}),
    (["PROFILE=local"], "model", {"name": "tiny"}),
    (["MODEL=small"], "model", {"name": "small", "activation_checkpointing": "full"}),
    (
        ["TRAIN.model.activation_checkpointing=selective"],
        "model",
        {"name": "llama3.1-8b", "activation_checkpointing": "selective"},
    ),
    (
        ["STEPS=2000", "LOG_EVERY=10", "DETERMINISTIC=0"],
        "training",
        {"steps": 2000, "log_every": 10, "deterministic": False, "efa_devices": 32},
    ),
    (
        ["CHECKPOINT_MODE=sync", "CHECKPOINT_INTERVAL=500", "CHECKPOINT_KEEP=2", "CHECKPOINT_BACKEND=dcp"],
        "checkpoint",
        {"mode": "sync", "interval": 500, "keep": 2, "backend": "dcp", "tiers": "peer"},  # sync: kit writer
    ),
    ([], "checkpoint", {"mode": "async", "interval": "auto", "tiers": "peer"}),  # GPU profiles: the plan's
    (["PROFILE=local"], "checkpoint", {"mode": "async", "tiers": "peer"}),  # the trainer's fixed default
    (["CHECKPOINT_MODE=off"], "checkpoint", {"mode": "off"}),
    (
        ["CHECKPOINT_INTERVAL=auto", "TRAIN.checkpoint.mtbf_s=3600", "TRAIN.checkpoint.interval_max=400"],
        "checkpoint",
        {"mode": "async", "interval": "auto", "mtbf_s": 3600, "interval_max": 400, "tiers": "peer"},
    ),
    (["FAULT_SPEC=kill:step=5:rank=1"], "fault", {"spec": "kill:step=5:rank=1"}),
    (
        ["FAULT_SCHEDULE_SEED=42", "FAULT_SCHEDULE_COUNT=5", "FAULT_SCHEDULE_AFTER_STEP=10"],
        "fault",
        {"schedule_seed": 42, "schedule_count": 5, "schedule_after_step": 10},
    ),
    (["INPROCESS=1", "INPROCESS_MAX_RESTARTS=4"], "inprocess", {"enabled": True, "max_restarts": 4}),
    (["TRAIN.optim.lr=0.0002"], "optim", {"lr": 0.0002}),
    (["SEQ_LEN=2048", "BATCH_SIZE=1"], "data", {"kind": "synthetic", "seq_len": 2048, "batch_size": 1}),
]


RESILIENCE = {"run", "training", "checkpoint", "fault", "inprocess"}


@pytest.mark.parametrize(
    "overrides",
    [
        ["ENTRYPOINT=python -m my.train", "STEPS=50", "SEED=3", "FAULT_SPEC=kill:step=5:rank=1",
         "INPROCESS=1", "CHECKPOINT_INTERVAL=10", "TRAIN.checkpoint.interval_max=400"],
        ["ENTRYPOINT=bash run.sh", "PROFILE=local"],
    ],
    ids=["module-p5", "program-local"],
)  # fmt: skip
def test_k8s_entrypoint_config_holds_only_the_resilience_sections(overrides: list[str]) -> None:
    """A user's script reads $KIT_CONFIG with the resilience API: run, training, checkpoint, fault and
    inprocess, every value given; the kit trainer's model, data and optim sections are left out."""
    manifests = _render(["RUN_ID=t", *overrides])
    configmap = _obj(manifests, "ConfigMap")
    config = yaml.safe_load(configmap["data"]["train.yaml"])
    assert set(config) <= RESILIENCE and {"run", "checkpoint", "inprocess"} <= set(config)
    assert config["run"] == {"id": "t", "root": "/fsx/runs", **({"seed": 3} if "SEED=3" in overrides else {})}
    if "STEPS=50" in overrides:
        assert config["training"] == {"steps": 50, "efa_devices": 32}
        assert config["fault"] == {"spec": "kill:step=5:rank=1"}
        assert config["checkpoint"] == {"mode": "async", "interval": 10, "interval_max": 400}
        assert config["inprocess"] == {"enabled": True}
    text = next(m.text for m in manifests if m.obj["kind"] == "ConfigMap")
    assert text.startswith("# Resilience config (run, training, checkpoint, fault, inprocess, straggler): ")
    assert _env(manifests)["KIT_CONFIG"] == "/etc/kit/train.yaml"
    assert "--config" not in _container(manifests)["command"]


def test_k8s_default_configmap_is_the_kit_trainers() -> None:
    text = next(m.text for m in _render(["RUN_ID=t"]) if m.obj["kind"] == "ConfigMap")
    assert text.startswith("# Trainer config (contract 4): the container reads it with --config;")
    assert {"model", "data"} <= set(yaml.safe_load(yaml.safe_load(text)["data"]["train.yaml"]))


@pytest.mark.parametrize(("overrides", "section", "expected"), TRAINER,
                         ids=[f"{o[0] if o else 'default'}:{s}" for o, s, _ in TRAINER])  # fmt: skip
def test_k8s_trainer_config_sections(overrides: list[str], section: str, expected: dict) -> None:
    manifests = _render(_with_run_id(overrides))
    config = yaml.safe_load(_obj(manifests, "ConfigMap")["data"]["train.yaml"])
    assert config[section] == expected
    assert set(config) <= {"run", "model", "data", "optim", "training", "checkpoint", "fault", "inprocess"}


def test_k8s_config_checksum_follows_the_config() -> None:
    a, b = _render(["RUN_ID=t", "STEPS=10"]), _render(["RUN_ID=t", "STEPS=11"])
    key = "kit.io/config-sha256"
    sha = [_obj(m, "Job")["spec"]["template"]["metadata"]["annotations"][key] for m in (a, b)]
    assert sha[0] != sha[1] and len(sha[0]) == 64
    assert _obj(a, "ConfigMap")["metadata"]["annotations"][key] == sha[0]
    assert (
        sha[0]
        == _obj(_render(["RUN_ID=t", "STEPS=10"]), "Job")["spec"]["template"]["metadata"]["annotations"][key]
    )


POD = ["sh", "-c", POD_WRAPPER, "kit-pod"]
WORKER = ["--no-python", "sh", "-c", WORKER_WRAPPER, "kit-worker"]
LAUNCH = [
    (
        ["LAUNCHER=kit", "MAX_RESTARTS=4", "HEARTBEAT_TIMEOUT=120", "HEARTBEAT_SAFETY_FACTOR=3", "RUN_ID=r1"],
        [
            "python",
            "-m",
            "fsdpkit.launcher",
            "--nnodes=2",
            "--nproc-per-node=8",
            "--node-rank=$(NODE_RANK)",
            "--spares=0",
            "--rdzv-backend=kit",
            "--rdzv-endpoint=r1-rdzv.kit-training.svc.cluster.local:29500",
            "--rdzv-id=r1",
            "--rdzv-conf=is_host=0,join_timeout=600,keep_alive_interval=0.1,keep_alive_max_attempt=12",
            "--max-restarts=4",
            "--monitor-interval=0.5",
            "--heartbeat-timeout=120",
            "--heartbeat-load-timeout=1200",
            "--node-failure-limit=0",
            "--node-failure-window=600",
            "--heartbeat-safety-factor=3",
            "--run-dir=/fsx/runs/r1",
            "-m",
            "fsdpkit.trainer",
            "--config",
            "/etc/kit/train.yaml",
        ],
    ),
    (
        ["LAUNCHER=ft_launcher", "RUN_ID=r1"],
        [
            *POD,
            "ft_launcher",
            "--nnodes=2:2",
            "--nproc-per-node=8",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=r1-0.r1.kit-training.svc.cluster.local:29500",
            "--rdzv-id=r1",
            "--max-restarts=20",
            "--monitor-interval=0.5",
            "--ft-initial-rank-heartbeat-timeout=1200",
            "--ft-rank-heartbeat-timeout=900",
            *WORKER,
            "-m",
            "fsdpkit.trainer",
            "--config",
            "/etc/kit/train.yaml",
        ],
    ),
    (
        ["LAUNCHER=torchrun", "RUN_ID=r1"],
        [
            *POD,
            "python",
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            "--nproc-per-node=8",
            "--node-rank=$(NODE_RANK)",
            "--master-addr=r1-0.r1.kit-training.svc.cluster.local",
            "--master-port=29500",
            "--max-restarts=0",
            "--monitor-interval=0.5",
            *WORKER,
            "-m",
            "fsdpkit.trainer",
            "--config",
            "/etc/kit/train.yaml",
        ],
    ),
]


@pytest.mark.parametrize(("overrides", "argv"), LAUNCH, ids=["kit", "ft_launcher", "torchrun"])
def test_k8s_launcher_command_lines(overrides: list[str], argv: list[str]) -> None:
    assert _container(_render(overrides))["command"] == argv


PROGRAM = ["--no-python", "sh", "-c", PROGRAM_WRAPPER, "kit-worker"]
# (launcher, ENTRYPOINT, what follows the launcher's own flags): python's module and script forms become the
# launcher's `-m mod` / `script`; any other program runs with --no-python (torchrun and ft_launcher: inside
# the worker wrapper, which keeps exit 78: python's for modules and scripts, the program's own otherwise).
ENTRYPOINTS = [
    ("kit", "python -m myproject.train --cfg x", ["-m", "myproject.train", "--cfg", "x"]),
    ("kit", "python3 -u -m myproject.train", ["-m", "myproject.train"]),
    ("kit", "python3.11 -mmyproject.train --lr=3e-4", ["-m", "myproject.train", "--lr=3e-4"]),
    ("kit", "python examples/hf_llama/train.py --steps 20", ["examples/hf_llama/train.py", "--steps", "20"]),
    ("kit", "python train.py --name 'a b' ''", ["train.py", "--name", "a b", ""]),
    ("kit", "python train.py --out $(RUN_DIR)/x", ["train.py", "--out", "$(RUN_DIR)/x"]),
    ("kit", "bash run.sh --x 1", ["--no-python", "bash", "run.sh", "--x", "1"]),
    ("kit", "/opt/x/train", ["--no-python", "/opt/x/train"]),
    (
        "kit",
        "/opt/venv/bin/python -X dev -m m",
        ["--no-python", "/opt/venv/bin/python", "-X", "dev", "-m", "m"],
    ),
    ("torchrun", "python -m myproject.train --cfg x", [*WORKER, "-m", "myproject.train", "--cfg", "x"]),
    ("torchrun", "python train.py --steps 20", [*WORKER, "train.py", "--steps", "20"]),
    ("torchrun", "bash run.sh --x 1", [*PROGRAM, "bash", "run.sh", "--x", "1"]),
    ("ft_launcher", "python -m myproject.train", [*WORKER, "-m", "myproject.train"]),
    ("ft_launcher", "/opt/x/train a", [*PROGRAM, "/opt/x/train", "a"]),
]


@pytest.mark.parametrize(("launcher", "entrypoint", "target"), ENTRYPOINTS,
                         ids=[f"{launcher}:{e}" for launcher, e, _ in ENTRYPOINTS])  # fmt: skip
def test_k8s_entrypoint_becomes_the_launchers_target(
    launcher: str, entrypoint: str, target: list[str]
) -> None:
    default = _container(_render(["RUN_ID=r1", f"LAUNCHER={launcher}"]))["command"]
    flags = default[: len(default) - (4 if launcher == "kit" else 9)]  # less the kit trainer's target
    command = _container(_render(["RUN_ID=r1", f"LAUNCHER={launcher}", f"ENTRYPOINT={entrypoint}"]))[
        "command"
    ]
    assert command == flags + target


def test_k8s_program_wrapper_differs_from_the_python_one_only_in_what_it_runs() -> None:
    assert PROGRAM_WRAPPER == WORKER_WRAPPER.replace('python "$@"', '"$@"') != WORKER_WRAPPER


@pytest.mark.parametrize("launcher", ["kit", "ft_launcher", "torchrun"])
@pytest.mark.parametrize("entrypoint", ["python -m my.train --cfg x", "python t.py", "bash run.sh"])
def test_k8s_every_launcher_with_an_entrypoint_is_valid(
    launcher: str, entrypoint: str, stack_outputs: dict
) -> None:
    outputs = merge_stack_outputs(stack_outputs)
    overrides = [
        "RUN_ID=t",
        "NODES=2",
        f"LAUNCHER={launcher}",
        f"ENTRYPOINT={entrypoint}",
        f"IMAGE={ECR_DIGEST}",
    ]
    manifests = _render(overrides, outputs=outputs)
    validate(manifests, versions=SCHEMA_VERSIONS)
    assert _container(manifests)["image"] == ECR_DIGEST


def test_k8s_job_failure_policy_and_security() -> None:
    job = _obj(_render(["RUN_ID=t"]), "Job")
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {
        "action": "FailJob",
        "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [69, 78]},
    }  # 78: a bad config; 69: a pod that found the run failed (its index must not succeed)
    assert rules[1] == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    assert rules[2]["action"] == "Count"
    assert (job["spec"]["maxFailedIndexes"], job["spec"]["podReplacementPolicy"]) == (0, "Failed")
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    sc = pod["containers"][0]["securityContext"]
    assert sc == {"privileged": False, "allowPrivilegeEscalation": False,
                  "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}}  # fmt: skip
    svc = _obj(_render(["RUN_ID=t"]), "Service")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True


def test_k8s_pv_only_when_cdk_has_no_claim() -> None:
    kinds = [m.obj["kind"] for m in _render(["RUN_ID=t"])]
    assert kinds == ["Namespace", "ServiceAccount", "PersistentVolume", "PersistentVolumeClaim", "ConfigMap",
                     "NetworkPolicy", "Service", "Deployment", "Service", "Job"]  # fmt: skip
    assert "PersistentVolume" not in [m.obj["kind"] for m in _render(["RUN_ID=t", "FSX_PVC=from-cdk"])]


# Policy: each mutation of a valid manifest set must produce its problem.
def _mutate(fn) -> list[str]:
    manifests = _render(["RUN_ID=t", "IMAGE=r/kit:1", "FSX_PVC=fsx", "CLUSTER_NAME=c1"])
    mutated = []
    for m in manifests:
        obj = copy.deepcopy(m.obj)
        fn(obj)
        mutated.append(Manifest(m.filename, m.text, obj))
    return policy_problems(mutated)


def _c(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]["containers"][0] if obj["kind"] == "Job" else {}


POLICY = [
    (
        lambda o: _c(o) and _c(o)["securityContext"].update(privileged=True),
        "securityContext.privileged: must be false",
    ),
    (
        lambda o: _c(o) and _c(o)["securityContext"]["capabilities"]["add"].append("SYS_ADMIN"),
        "capabilities.add: ['SYS_ADMIN'] not allowed; only IPC_LOCK",
    ),
    (
        lambda o: _c(o) and _c(o)["securityContext"].pop("allowPrivilegeEscalation"),
        "allowPrivilegeEscalation: must be false",
    ),
    (
        lambda o: _c(o) and _c(o)["env"].append({"name": "WANDB_API_KEY", "value": "abc123"}),
        "(WANDB_API_KEY): looks like a secret in plain text; use valueFrom.secretKeyRef",
    ),
    (
        lambda o: _c(o) and _c(o)["resources"]["requests"].update({"nvidia.com/gpu": "4"}),
        "resources: nvidia.com/gpu requests (4) must equal limits (8)",
    ),
    (
        lambda o: (
            o["kind"] == "Job"
            and o["spec"]["template"]["spec"]["volumes"].append(
                {"name": "h", "hostPath": {"path": "/dev/shm"}}
            )
        ),
        "volumes[4]: hostPath is not allowed",
    ),
    (
        lambda o: o["kind"] == "Job" and o["spec"]["template"]["spec"].update(hostNetwork=True),
        "hostNetwork: must not be true",
    ),
    (
        lambda o: o["kind"] == "Job" and o["spec"]["template"]["spec"].update(subdomain="other"),
        "subdomain: 'other' names no Service in kit-training; no pod DNS",
    ),
    (
        lambda o: o["kind"] == "Service" and o["spec"].update(publishNotReadyAddresses=False),
        "publishNotReadyAddresses must be true so rank 0 resolves early",
    ),
    (
        lambda o: o["kind"] == "Service" and o["spec"].update(clusterIP="10.0.0.1"),
        "clusterIP must be None (headless)",
    ),
    (
        lambda o: _c(o) and _c(o)["env"][4].update(value="t-0.t"),
        "env.MASTER_ADDR: 't-0.t' must be 't-0.t.kit-training",
    ),
    (
        lambda o: o["kind"] == "Job" and o["spec"].update(parallelism=1),
        "spec.parallelism: must equal completions",
    ),
    (
        lambda o: o["kind"] == "ConfigMap" and o["data"].update(key="AKIAABCDEFGHIJKLMNOP"),
        "looks like a credential",
    ),
    (lambda o: _c(o) and _c(o).update(image="PLACEHOLDER.invalid/kit"), "dry-run placeholder"),
]


@pytest.mark.parametrize(("mutation", "problem"), POLICY, ids=[p.split(":")[0][:40] for _, p in POLICY])
def test_k8s_policy_catches(mutation, problem: str) -> None:
    problems = _mutate(mutation)
    assert any(problem in p for p in problems), problems


def test_k8s_policy_is_clean_for_rendered_manifests() -> None:
    assert _mutate(lambda o: None) == []


def test_k8s_strict_schema_catches_a_misspelt_field() -> None:
    manifests = _render(["RUN_ID=t"])
    job = next(m for m in manifests if m.obj["kind"] == "Job")
    obj = copy.deepcopy(job.obj)
    obj["spec"]["template"]["spec"]["subdomian"] = obj["spec"]["template"]["spec"].pop("subdomain")
    problems = schema_problems([Manifest(job.filename, job.text, obj)], "1.35")
    assert len(problems) == 1 and "'subdomian' was unexpected" in problems[0]
    assert problems[0].startswith("06-job.yaml: Job/t: spec.template.spec:")


def test_k8s_unsupported_schema_version() -> None:
    with pytest.raises(
        ValueError, match=r"^KUBERNETES_VERSION=1.99: is not supported; .* use one of 1.29 to 1.37$"
    ):
        validate(_render(["RUN_ID=t"]), versions=["1.99"], allow_placeholders=True)


def test_k8s_validate_reports_every_problem() -> None:
    manifests = _render(["RUN_ID=t"])
    with pytest.raises(ManifestError) as err:
        validate(manifests, versions=["1.35"])  # placeholders not allowed
    # The four outputs, the store's image, and the cluster name in the metrics' ClusterName and log group.
    assert len(err.value.problems) == 7 and str(err.value).endswith("(and 6 more)")
    assert all("dry-run placeholder" in p for p in err.value.problems)


def test_k8s_templates_refuse_undefined_values() -> None:
    with pytest.raises(jinja2.UndefinedError):
        environment().get_template("job.yaml.j2").render(job_name="x")


def test_k8s_golden_p5(stack_outputs: dict, tmp_path: Path) -> None:
    """The p5 manifests from real-looking stack outputs; K8S_UPDATE_GOLDEN=1 rewrites them after review."""
    values = build_values(
        outputs=merge_stack_outputs(stack_outputs), overrides=["RUN_ID=golden-p5", "NODES=2"]
    )
    manifests = render(values)
    validate(manifests, versions=SCHEMA_VERSIONS)
    if os.environ.get("K8S_UPDATE_GOLDEN") == "1":
        write(manifests, GOLDEN)
    expected = sorted(p.name for p in GOLDEN.glob("*.yaml"))
    assert [m.filename for m in manifests] == expected
    for m in manifests:
        assert m.text == (GOLDEN / m.filename).read_text(encoding="utf-8"), (
            f"{m.filename} differs from golden"
        )


def test_k8s_kueue_queue_and_priority_class_are_optional() -> None:
    plain = _obj(_render(["RUN_ID=t"]), "Job")
    assert "kueue.x-k8s.io/queue-name" not in plain["metadata"]["labels"] and "suspend" not in plain["spec"]
    assert "priorityClassName" not in plain["spec"]["template"]["spec"]
    manifests = _render(["RUN_ID=t", "KUEUE_QUEUE=team-a", "PRIORITY_CLASS=training-high"])
    validate(manifests, versions=SCHEMA_VERSIONS, allow_placeholders=True)
    job = _obj(manifests, "Job")
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["spec"]["suspend"] is True  # Kueue admits all pods at once, then unsuspends the Job
    assert "kueue.x-k8s.io/queue-name" not in job["spec"]["template"]["metadata"]["labels"]
    assert job["spec"]["template"]["spec"]["priorityClassName"] == "training-high"


def _edited(manifests: list[Manifest], edit) -> list[Manifest]:
    out = []
    for m in manifests:
        obj = json.loads(json.dumps(m.obj))
        if obj["kind"] == "Job":
            edit(obj)
        out.append(Manifest(m.filename, m.text, obj))
    return out


LABEL_EDITS = {
    "label key": (
        lambda job: job["metadata"]["labels"].update({"x" * 64: "v"}),
        f"06-job.yaml: Job/t: metadata.labels: key '{'x' * 64}' has a name part of 64 characters "
        "(at most 63)",
    ),
    "label value": (
        lambda job: job["spec"]["template"]["metadata"]["labels"].update({"team": "-ml"}),
        "06-job.yaml: Job/t: spec.template.metadata.labels[team]: value '-ml' must be empty, or at most 63 "
        "characters",
    ),
    "annotation key": (
        lambda job: job["metadata"]["annotations"].update({"bad key": "v"}),
        "06-job.yaml: Job/t: metadata.annotations: key 'bad key' must be a qualified name",
    ),
    "selector key": (
        lambda job: job["spec"]["template"]["spec"]["nodeSelector"].update({"a/b/c": "v"}),
        "06-job.yaml: Job/t: spec.template.spec.nodeSelector: key 'a/b/c' has more than one '/'",
    ),
}


@pytest.mark.parametrize("case", LABEL_EDITS)
def test_k8s_policy_checks_label_and_annotation_rules(case: str) -> None:
    """Hand-edited manifests (or a template bug) with names the API server would refuse fail the policy."""
    edit, message = LABEL_EDITS[case]
    problems = policy_problems(_edited(_render(["RUN_ID=t"]), edit), allow_placeholders=True)
    assert len(problems) == 1 and problems[0].startswith(message), problems


def test_k8s_rendezvous_store_is_its_own_pod_on_the_system_nodes(stack_outputs: dict) -> None:
    """The kit's rendezvous lives in a Deployment + ClusterIP Service no training pod owns; pods are
    clients (is_host=0). Spares add indexes, never ranks; the drain's grace reaches the pods' env."""
    outputs = merge_stack_outputs(stack_outputs)
    manifests = _render(["RUN_ID=t", "NODES=2", "SPARES=1"], outputs=outputs)
    validate(manifests, versions=SCHEMA_VERSIONS)
    store = _obj(manifests, "Deployment", store=True)
    pod = store["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"role": "system"} and "tolerations" not in pod
    assert pod["containers"][0]["command"] == ["python", "-m", "fsdpkit.launcher.store", "--port=29500"]
    svc = _obj(manifests, "Service", store=True)
    assert svc["metadata"]["name"] == "t-rdzv" and svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["selector"] == store["spec"]["selector"]["matchLabels"]
    trainer_svc = _obj(manifests, "Service")
    assert trainer_svc["spec"]["selector"].items() - pod.get("labels", {}).items()  # never selects the store
    job = _obj(manifests, "Job")
    assert job["spec"]["completions"] == 3
    env = _env(manifests)
    assert env["WORLD_SIZE"] == "16" and env["NNODES"] == "2"
    assert env["KIT_TERMINATION_GRACE_S"] == str(
        job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    )
    cmd = _container(manifests)["command"]
    assert "--spares=1" in cmd and "--nnodes=2" in cmd
    assert "--node-failure-limit=3" in cmd  # with a spare a failing node is given up; without one, never
    assert "--rdzv-endpoint=t-rdzv.kit-training.svc.cluster.local:29500" in cmd
    keep_alive = ["RDZV_KEEP_ALIVE_S=0.5", "RDZV_KEEP_ALIVE_ATTEMPTS=4", "REPLACEMENT_WAIT_S=90"]
    cmd = _container(_render(["RUN_ID=t", *keep_alive]))["command"]
    assert "--rdzv-conf=is_host=0,join_timeout=90,keep_alive_interval=0.5,keep_alive_max_attempt=4" in cmd


@pytest.mark.parametrize("launcher", ["torchrun", "ft_launcher"])
def test_k8s_baselines_keep_their_rendezvous_on_pod_0(launcher: str) -> None:
    manifests = _render(["RUN_ID=t", f"LAUNCHER={launcher}", "RDZV_KEEP_ALIVE_S=0.5"])
    assert not any("keep_alive" in a for a in _container(manifests)["command"])  # their own set-up
    assert not [m for m in manifests if m.obj["kind"] == "Deployment"]
    assert [m.obj["metadata"]["name"] for m in manifests if m.obj["kind"] == "Service"] == ["t"]
    assert any("t-0.t.kit-training.svc.cluster.local" in a for a in _container(manifests)["command"])


def test_k8s_grace_period_is_sized_from_the_checkpoint() -> None:
    """llama3.1-8b: 96 GB checkpoint, two writes at 1000 MiB/s + 30 s: 214 s; at 2000 MiB/s: 122 s."""
    grace = _obj(_render(["RUN_ID=t"]), "Job")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    fast = _obj(_render(["RUN_ID=t", "CHECKPOINT_WRITE_MIB_S=2000"]), "Job")
    assert (grace, fast["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]) == (214, 122)


@pytest.mark.parametrize(
    ("overrides", "chosen", "shm"),
    [
        ([], "peer", 180),  # p5, 2 nodes of the 8B: 4 x 44.9 GiB (kept + written, own + buddy's) fits 900
        (["NODES=1"], "local", 180),  # no buddy; 2 x 89.7 GiB
        (["SHM_GIB=100"], "local", 100),  # peer would need 180: auto takes what fits
        (["SHM_GIB=64"], "off", 64),
        (["CHECKPOINT_TIERS=off"], "off", 90),  # still twice the staging
        (["LAUNCHER=torchrun", "CHECKPOINT_MODE=sync"], "off", 90),  # only the kit launcher keeps tiers
        (["CHECKPOINT_BACKEND=dcp"], "off", 90),  # DCP's own staging keeps no copy
        (["TRAIN.checkpoint.tier_keep=2"], "peer", 270),
    ],
)
def test_k8s_memory_tiers_take_what_fits_in_the_pods_memory(
    overrides: list[str], chosen: str, shm: int
) -> None:
    manifests = _render(["RUN_ID=t", *overrides])
    config = yaml.safe_load(_obj(manifests, "ConfigMap")["data"]["train.yaml"])
    assert config["checkpoint"].get("tiers") == chosen
    volumes = _obj(manifests, "Job")["spec"]["template"]["spec"]["volumes"]
    assert next(v for v in volumes if v["name"] == "shm")["emptyDir"]["sizeLimit"] == f"{shm}Gi"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["CHECKPOINT_TIERS=peer", "SHM_GIB=100"],
            "CHECKPOINT_TIERS=peer: needs 180 GiB of /dev/shm per pod (4 x 44.9 GiB, the node's share of "
            "the checkpoint, with tier_keep=1) and the pod has 100 GiB for it (SHM_GIB): use "
            "CHECKPOINT_TIERS=local or off, or more NODES",
        ),
        (["CHECKPOINT_TIERS=local", "LAUNCHER=torchrun", "CHECKPOINT_MODE=sync"], "needs LAUNCHER=kit"),
        (["CHECKPOINT_TIERS=peer", "CHECKPOINT_MODE=off"], "CHECKPOINT_MODE=off saves nothing"),
    ],
)
def test_k8s_memory_tiers_that_cannot_work_are_refused(overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        _render(["RUN_ID=t", *overrides])
