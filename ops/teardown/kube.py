"""What teardown reads from each live kit cluster through kubectl, once, before it deletes anything.

Two facts decide what a user kept inside a cluster:
- which namespaces are the kit's: those labelled `app.kubernetes.io/managed-by=kit` (the kit renders that
  label on the namespace of every job, and infra on the FSx claim's namespace). Objects elsewhere belong to
  someone else on a shared cluster and are never deleted one by one;
- which EBS volumes a PersistentVolume keeps: reclaim policy `Retain` says the volume outlives its claim, so
  teardown keeps it unless `--delete-data`. The same holds for a volume whose claim lives outside the kit's
  namespaces.
Read at the start (the Kubernetes step deletes claims, and the cluster goes in step 4); a cluster that cannot
be read is named with the reason, and its claims' volumes are kept (their policy is unknown).
"""

from __future__ import annotations

import json
import shutil
import subprocess

from fsdpkit.contracts.labels import MANAGED_BY, MANAGED_BY_LABEL
from fsdpkit.ops.teardown.model import ClusterFacts, PvFacts, Unavailable

KUBECTL_TIMEOUT_S = 30
SHARED_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})
"""Never the kit's alone, even when labelled (a job rendered into `default` labels it): others' objects live
there too."""
EBS_CSI_DRIVER = "ebs.csi.aws.com"


def kubectl(binary: str, *args: str) -> subprocess.CompletedProcess[str]:
    """One kubectl call with a server-side and a local deadline; a timeout reads as a failed call."""
    try:
        return subprocess.run(
            [binary, *args, f"--request-timeout={KUBECTL_TIMEOUT_S}s"],
            capture_output=True,
            text=True,
            timeout=KUBECTL_TIMEOUT_S + 10,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess([binary, *args], 124, "", f"timed out after {KUBECTL_TIMEOUT_S}s")


def _contexts(binary: str, endpoints: dict[str, str]) -> dict[str, str]:
    """cluster name -> kubeconfig context whose server is that cluster's endpoint."""
    out = kubectl(binary, "config", "view", "--raw", "-o", "json")
    if out.returncode != 0:
        raise Unavailable(f"kubectl config view failed: {out.stderr.strip()[:200]}")
    cfg = json.loads(out.stdout or "{}")
    servers = {c["name"]: c["cluster"].get("server", "") for c in cfg.get("clusters") or []}
    by_server = {ctx["context"].get("cluster"): ctx["name"] for ctx in cfg.get("contexts") or []}
    result = {}
    for name, endpoint in endpoints.items():
        for kc_cluster, server in servers.items():
            if endpoint and server.rstrip("/") == endpoint.rstrip("/") and kc_cluster in by_server:
                result[name] = by_server[kc_cluster]
    return result


def _get(binary: str, ctx: str, kind: str) -> list[dict]:
    out = kubectl(binary, "--context", ctx, "get", kind, "-o", "json")
    if out.returncode != 0:
        raise Unavailable(f"kubectl get {kind} failed: {out.stderr.strip()[:200]}")
    return json.loads(out.stdout or "{}").get("items", [])


def volume_id(pv: dict) -> str | None:
    """The EBS volume behind a PV: the CSI driver's volume handle, or the in-tree source (`aws://az/vol-...`)."""
    spec = pv.get("spec") or {}
    csi = spec.get("csi") or {}
    if csi.get("driver") == EBS_CSI_DRIVER and csi.get("volumeHandle"):
        return str(csi["volumeHandle"])
    in_tree = (spec.get("awsElasticBlockStore") or {}).get("volumeID")
    return str(in_tree).rsplit("/", 1)[-1] if in_tree else None


def kit_namespace(meta: dict) -> bool:
    labels = meta.get("labels") or {}
    return labels.get(MANAGED_BY_LABEL) == MANAGED_BY and meta.get("name") not in SHARED_NAMESPACES


def _read_one(binary: str, ctx: str) -> ClusterFacts:
    namespaces = frozenset(
        n["metadata"]["name"] for n in _get(binary, ctx, "namespaces") if kit_namespace(n["metadata"])
    )
    volumes = {}
    for pv in _get(binary, ctx, "persistentvolumes"):
        vid = volume_id(pv)
        if vid is None:
            continue
        claim = (pv.get("spec") or {}).get("claimRef") or {}
        volumes[vid] = PvFacts(
            name=pv["metadata"]["name"],
            reclaim=str((pv.get("spec") or {}).get("persistentVolumeReclaimPolicy", "Delete")),
            claim_namespace=str(claim.get("namespace", "")),
            claim=f"{claim.get('namespace', '')}/{claim.get('name', '')}" if claim else "",
        )
    return ClusterFacts(context=ctx, namespaces=namespaces, volumes=volumes)


def read_clusters(binary: str, endpoints: dict[str, str]) -> tuple[dict[str, ClusterFacts], dict[str, str]]:
    """(facts per readable cluster, why each other cluster could not be read); never raises."""
    if not endpoints:
        return {}, {}
    if shutil.which(binary) is None:
        why = f"{binary} not found"
        return {}, dict.fromkeys(endpoints, why)
    try:
        contexts = _contexts(binary, endpoints)
    except Unavailable as exc:
        return {}, dict.fromkeys(endpoints, str(exc))
    facts: dict[str, ClusterFacts] = {}
    unread: dict[str, str] = {}
    for cluster in endpoints:
        if cluster not in contexts:
            unread[cluster] = f"no kubeconfig context (run `aws eks update-kubeconfig --name {cluster}`)"
            continue
        try:
            facts[cluster] = _read_one(binary, contexts[cluster])
        except (Unavailable, json.JSONDecodeError) as exc:
            unread[cluster] = f"cluster {cluster} does not answer: {exc}"
    return facts, unread
