"""The run's security objects, computed from trusted JobValues; the templates only place them.

Trusted: the run's own pods, running the image the run was rendered with. Not trusted: other pods and runs on
the cluster network, and whatever lands on shared storage outside this run's folder (docs/k8s.md,
"Security"). So, per run: a NetworkPolicy that admits only the run's pods, a token Secret mounted only into
the run's pods, the run's folder as the only writable part of the shared file system, the straggler cordon
through a node agent whose grant is narrowed to its own node and the kit's fields, and the image pinned.
"""

from __future__ import annotations

from typing import Any

from fsdpkit.contracts import env as kit_env
from fsdpkit.contracts.labels import MANAGED_BY, MANAGED_BY_LABEL, RUN_ID_LABEL
from fsdpkit.k8s.model import FSX_MOUNT, RUNS_ROOT, JobValues
from fsdpkit.k8s.profiles import get_profile

# -- the run's token (fsdpkit.contracts.env.RUN_TOKEN_FILE) ------------------------------------------------
RUN_TOKEN_DIR = "/var/run/fsdpkit/run-token"
"""Where the run's Secret is mounted, read-only, in its trainer pods and its rendezvous store pod only."""
RUN_TOKEN_KEY = "token"
RUN_TOKEN_PATH = f"{RUN_TOKEN_DIR}/{RUN_TOKEN_KEY}"
RUN_TOKEN_VOLUME = "run-token"

# -- shared storage ----------------------------------------------------------------------------------------
INPUT_FOLDERS: tuple[str, ...] = ("models", "data", "tokenizers", "code", "cache")
"""Folders of the shared file system every run reads and none writes: /fsx/<name>, mounted read-only."""

# -- the straggler cordon ----------------------------------------------------------------------------------
NODE_AGENT_CONTAINER = "node-agent"
NODE_AGENT_DIR = "/var/run/fsdpkit/node-agent"
"""The emptyDir where the launcher leaves a cordon request and the node agent answers it."""
NODE_AGENT_DIR_ENV = kit_env.NODE_AGENT_DIR
"""Names that folder in the trainer container."""
SA_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where the node agent alone finds its projected service-account token and the cluster CA."""
SA_TOKEN_EXPIRATION_S = 3600
"""The projected token's lifetime; the kubelet renews it at 80 %, and it dies with the pod."""
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"
"""The user-info extra of a pod-bound service-account token: the pod's node (Kubernetes >= 1.30)."""
CORDON_MIN_VERSION = (1, 30)
"""ValidatingAdmissionPolicy v1 (GA) and the node-name claim (ServiceAccountTokenPodNodeInfo, beta and on by
default) both arrive in 1.30; before it the grant could not be narrowed to the pod's own node."""
NODE_CORDON_ROLE = "kit-node-cordon"
STRAGGLER_LABEL = "kit.io/straggler"
REASON_ANNOTATION = "kit.io/straggler-reason"
NODE_SPEC_KEPT: tuple[str, ...] = (
    "configSource",
    "externalID",
    "podCIDR",
    "podCIDRs",
    "providerID",
    "taints",
)
"""Every NodeSpec field but `unschedulable` (the schema's list; tests/k8s/test_k8s_security.py checks it)."""
NODE_META_KEPT: tuple[str, ...] = ("finalizers", "ownerReferences")
"""ObjectMeta fields a client may set that the agent must leave alone (labels and annotations apart)."""

# -- Pod Security Admission --------------------------------------------------------------------------------
PSA_ENFORCE = "privileged"
"""The strictest level every kit pod passes: the trainers add IPC_LOCK (EFA pins memory), which `baseline`
refuses; nothing else in them is above `baseline` (tests/k8s/test_k8s_security.py checks the rules)."""
PSA_WARN = "restricted"
"""warn and audit: what `restricted` would refuse is reported by the API server, never blocked."""


def on_cluster(v: JobValues) -> bool:
    """EKS profiles; the local runner emulates neither Secrets, subPaths nor sidecars (k8s/local.py)."""
    return get_profile(v.profile).requires_image


def run_labels(v: JobValues) -> dict[str, str]:
    """Labels every pod of the run carries (trainers, spares, the rendezvous store)."""
    return {RUN_ID_LABEL: v.run_id, MANAGED_BY_LABEL: MANAGED_BY}


def network_policy(v: JobValues) -> dict[str, Any]:
    """Ingress to the run's pods from the run's pods in its namespace only, on any port.

    Any port: besides the three fixed ones (rendezvous store, workers' store, in-process store), a round's
    store and gloo's and NCCL's socket bootstrap listen on free ports (fsdpkit.contracts.ports). A
    podSelector without a namespaceSelector matches pods of the policy's own namespace only."""
    selector = run_labels(v)
    return {
        "name": f"{v.run_id}-run-only",
        "pod_selector": selector,
        "from": [{"podSelector": {"matchLabels": dict(selector)}}],
    }


def run_token_secret_name(run_id: str) -> str:
    return f"{run_id}-run-token"


def run_token_secret(v: JobValues, labels: dict[str, str], token: str) -> dict[str, Any]:
    """The run's Secret holding `token`: built at apply time only, never written to a file or a golden.
    Immutable: nothing can swap a running job's token (kubectl.create_if_absent keeps the first one)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": run_token_secret_name(v.run_id), "namespace": v.namespace, "labels": labels},
        "type": "Opaque",
        "immutable": True,
        "stringData": {RUN_TOKEN_KEY: token},
    }


def run_token_volume(v: JobValues) -> dict[str, Any]:
    """Only the key `token`, owner-read-only; a Secret without it keeps the pod from starting."""
    return {
        "name": RUN_TOKEN_VOLUME,
        "secret": {
            "secretName": run_token_secret_name(v.run_id),
            "defaultMode": 0o400,
            "items": [{"key": RUN_TOKEN_KEY, "path": RUN_TOKEN_KEY}],
        },
    }


def run_token_mount() -> dict[str, Any]:
    return {"name": RUN_TOKEN_VOLUME, "mountPath": RUN_TOKEN_DIR, "readOnly": True}


def run_token_env() -> dict[str, str]:
    return {"name": kit_env.RUN_TOKEN_FILE, "value": RUN_TOKEN_PATH}


def storage_mounts(v: JobValues) -> list[dict[str, Any]]:
    """The FSx volume as the pod sees it: the run's folder read-write, the inputs read-only, nothing else.
    Locally, the whole volume (the local runner maps a mount path to a folder and knows no subPath)."""
    if not on_cluster(v):
        return [{"name": "fsx", "mountPath": FSX_MOUNT}]
    run_sub = f"{RUNS_ROOT.removeprefix(FSX_MOUNT + '/')}/{v.run_id}"
    mounts = [{"name": "fsx", "mountPath": f"{RUNS_ROOT}/{v.run_id}", "subPath": run_sub}]
    for folder in INPUT_FOLDERS:
        mounts.append(
            {"name": "fsx", "mountPath": f"{FSX_MOUNT}/{folder}", "subPath": folder, "readOnly": True}
        )
    return mounts


def pull_policy(v: JobValues, image: str) -> str:
    """IMAGE_PULL_POLICY, else IfNotPresent for an image by digest (it cannot change) and Always for a tag
    (a re-pushed tag would otherwise run old code on cached nodes and new code on fresh ones)."""
    if v.image_pull_policy:
        return v.image_pull_policy
    return "IfNotPresent" if "@sha256:" in image else "Always"


def cordon_allowed(v: JobValues) -> bool:
    """Whether the node agent renders: replace with spares on an EKS profile (locally nothing to cordon)."""
    return v.straggler_policy == "replace" and v.spares > 0 and on_cluster(v)


def _unchanged(path: str) -> str:
    return (
        f"has(object.{path}) == has(oldObject.{path}) && (!has(object.{path}) || object.{path} == "
        f"oldObject.{path})"
    )


def _only_key_changes(path: str, key: str) -> str:
    """Every entry of the map at `path` but `key` is kept: none added, changed or removed."""
    new, old = f"object.{path}", f"oldObject.{path}"
    kept = f"(has({old}) && k in {old} && {old}[k] == {new}[k])"
    return (
        f"(!has({new}) || {new}.all(k, k == '{key}' || {kept})) && "
        f"(!has({old}) || {old}.all(k, k == '{key}' || (has({new}) && k in {new})))"
    )


def cordon_validations() -> list[dict[str, str]]:
    """The CEL rules a node patch by the agent must pass: its own node, a cordon, only the kit's fields."""
    return [
        {
            "expression": f"has(request.userInfo.extra) && '{NODE_NAME_CLAIM}' in request.userInfo.extra && "
            f"request.userInfo.extra['{NODE_NAME_CLAIM}'] == [object.metadata.name]",
            "message": "the kit's node agent may patch only the node its pod runs on",
        },
        {
            "expression": "has(object.spec.unschedulable) && object.spec.unschedulable == true",
            "message": "the kit's node agent may cordon a node, never uncordon it",
        },
        {
            "expression": " && ".join(_unchanged(f"spec.{f}") for f in NODE_SPEC_KEPT),
            "message": "the kit's node agent may change spec.unschedulable only",
        },
        {
            "expression": " && ".join(_unchanged(f"metadata.{f}") for f in NODE_META_KEPT),
            "message": "the kit's node agent may not change finalizers or owner references",
        },
        {
            "expression": _only_key_changes("metadata.labels", STRAGGLER_LABEL),
            "message": f"the kit's node agent may change the label {STRAGGLER_LABEL} only",
        },
        {
            "expression": _only_key_changes("metadata.annotations", REASON_ANNOTATION),
            "message": f"the kit's node agent may change the annotation {REASON_ANNOTATION} only",
        },
    ]


def node_access(v: JobValues) -> dict[str, Any] | None:
    """The per-run grant of the straggler cordon: the ClusterRole (patch nodes; shared by all runs, it grants
    nothing unbound), this run's ClusterRoleBinding to the job's ServiceAccount, and this run's
    ValidatingAdmissionPolicy + binding that narrow it. Cluster-scoped objects cannot be owned by a
    namespaced Job, so `make train-job-delete` deletes this run's three by its run-id label; the token
    itself is pod-bound and dies with the run's last pod."""
    if not cordon_allowed(v):
        return None
    name = f"{NODE_CORDON_ROLE}.{v.namespace}.{v.run_id}"
    user = f"system:serviceaccount:{v.namespace}:{v.service_account}"
    return {
        "role": NODE_CORDON_ROLE,
        "binding": name,
        "policy": name,
        "role_labels": {MANAGED_BY_LABEL: MANAGED_BY, "app.kubernetes.io/component": "straggler-cordon"},
        "labels": {**run_labels(v), "app.kubernetes.io/component": "straggler-cordon"},
        "match_conditions": [
            {"name": "the-runs-service-account", "expression": f"request.userInfo.username == '{user}'"}
        ],
        "validations": cordon_validations(),
    }


def node_agent_container(v: JobValues, *, image: str, pull: str) -> dict[str, Any]:
    """The native sidecar (restartPolicy Always) that alone mounts the API token and patches the node."""
    return {
        "name": NODE_AGENT_CONTAINER,
        "image": image,
        "imagePullPolicy": pull,
        "restartPolicy": "Always",
        "command": ["python", "-m", "fsdpkit.launcher.node_agent", f"--folder={NODE_AGENT_DIR}"],
        "env": [
            {"name": kit_env.NODE_NAME, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
        ],
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"cpu": "100m", "memory": "128Mi"},
        },
        "securityContext": {
            "privileged": False,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "node-agent", "mountPath": NODE_AGENT_DIR},
            {"name": "node-agent-token", "mountPath": SA_TOKEN_DIR, "readOnly": True},
        ],
    }


def node_agent_volumes() -> list[dict[str, Any]]:
    """The shared request folder and the agent's projected token (the same sources as the kubelet's own
    automount: a pod-bound token, the cluster CA, the namespace)."""
    return [
        {"name": "node-agent", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {
            "name": "node-agent-token",
            "projected": {
                "defaultMode": 0o400,
                "sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": SA_TOKEN_EXPIRATION_S}},
                    {
                        "configMap": {
                            "name": "kube-root-ca.crt",
                            "items": [{"key": "ca.crt", "path": "ca.crt"}],
                        }
                    },
                    {
                        "downwardAPI": {
                            "items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]
                        }
                    },
                ],
            },
        },
    ]


def psa_labels(kubernetes_version: str) -> dict[str, str]:
    """Pod Security Admission labels of the kit's namespace, pinned to the cluster's version of the rules."""
    version = f"v{kubernetes_version}"
    labels: dict[str, str] = {}
    for mode, level in (("enforce", PSA_ENFORCE), ("warn", PSA_WARN), ("audit", PSA_WARN)):
        labels[f"pod-security.kubernetes.io/{mode}"] = level
        labels[f"pod-security.kubernetes.io/{mode}-version"] = version
    return labels
