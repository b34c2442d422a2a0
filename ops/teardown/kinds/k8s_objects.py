"""Kubernetes objects that own AWS resources, deleted first through kubectl while the cluster answers.

Jobs (the trainer gets SIGTERM and its grace period to finish a checkpoint), Services of type LoadBalancer and
Ingresses (the Load Balancer Controller then deletes its LBs, target groups and SGs), and PVCs (the CSI
drivers delete EBS volumes / FSx file systems whose reclaim policy is Delete). The cluster carries the kit
tag and is about to be deleted, so every such object in it is the kit's. The kubeconfig context is the one
whose server is the cluster's endpoint (`aws eks update-kubeconfig --name <cluster>` creates it).
"""

from __future__ import annotations

import json
import shutil
import subprocess

from fsdpkit.ops.aws import Aws
from fsdpkit.ops.teardown.model import DeleteFailed, Kind, Resource, Scope, State, Unavailable

KUBECTL_TIMEOUT_S = 30
OBJECT_KINDS = "jobs.batch,services,ingresses.networking.k8s.io,persistentvolumeclaims"


def _kubectl(scope: Scope, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [scope.options.kubectl, *args, f"--request-timeout={KUBECTL_TIMEOUT_S}s"],
        capture_output=True,
        text=True,
        timeout=KUBECTL_TIMEOUT_S + 10,
        check=False,
    )


def _contexts(scope: Scope) -> dict[str, str]:
    """cluster name -> kubeconfig context whose server is that cluster's endpoint."""
    out = _kubectl(scope, "config", "view", "--raw", "-o", "json")
    if out.returncode != 0:
        raise Unavailable(f"kubectl config view failed: {out.stderr.strip()[:200]}")
    cfg = json.loads(out.stdout or "{}")
    servers = {c["name"]: c["cluster"].get("server", "") for c in cfg.get("clusters") or []}
    by_server = {ctx["context"].get("cluster"): ctx["name"] for ctx in cfg.get("contexts") or []}
    result = {}
    for name, endpoint in scope.cluster_endpoints.items():
        for kc_cluster, server in servers.items():
            if endpoint and server.rstrip("/") == endpoint.rstrip("/") and kc_cluster in by_server:
                result[name] = by_server[kc_cluster]
    return result


def list_objects(aws: Aws, scope: Scope) -> list[Resource]:
    if not scope.clusters:
        return []
    if shutil.which(scope.options.kubectl) is None:
        raise Unavailable(
            f"{scope.options.kubectl} not found; Kubernetes objects are not deleted first "
            "(the AWS sweep below still removes what their controllers left)"
        )
    contexts = _contexts(scope)
    missing = [c for c in scope.clusters if c not in contexts]
    if missing:
        raise Unavailable(
            f"no kubeconfig context for cluster(s) {', '.join(missing)}; "
            f"run `aws eks update-kubeconfig --name {missing[0]}` to delete Kubernetes objects first"
        )
    found = []
    for cluster, ctx in contexts.items():
        out = _kubectl(scope, "--context", ctx, "get", OBJECT_KINDS, "--all-namespaces", "-o", "json")
        if out.returncode != 0:
            raise Unavailable(f"cluster {cluster} does not answer: {out.stderr.strip()[:200]}")
        for item in json.loads(out.stdout).get("items", []):
            kind = item["kind"]
            if kind == "Service" and item.get("spec", {}).get("type") != "LoadBalancer":
                continue
            meta = item["metadata"]
            ref = f"{kind.lower()}/{meta['name']}"
            found.append(
                Resource(
                    kind="k8s",
                    id=f"{cluster}:{meta.get('namespace', '')}:{ref}",
                    name=ref,
                    tags=meta.get("labels") or {},
                    detail={
                        "k8s_cluster": cluster,
                        "context": ctx,
                        "kubectl": scope.options.kubectl,
                        "namespace": meta.get("namespace", ""),
                        "ref": ref,
                    },
                )
            )
    return found


def _args(r: Resource) -> list[str]:
    return ["--context", r.detail["context"], "-n", r.detail["namespace"], r.detail["ref"]]


def delete_object(aws: Aws, r: Resource, scope: Scope) -> None:
    out = _kubectl(scope, "delete", *_args(r), "--wait=false", "--ignore-not-found")
    if out.returncode != 0:
        raise DeleteFailed(f"kubectl delete {r.detail['ref']}: {out.stderr.strip()[:200]}")


def object_state(aws: Aws, r: Resource) -> tuple[State, str]:
    out = subprocess.run(
        [r.detail["kubectl"], "get", *_args(r), "-o", "name", "--ignore-not-found"],
        capture_output=True,
        text=True,
        timeout=KUBECTL_TIMEOUT_S,
        check=False,
    )
    if out.returncode == 0 and not out.stdout.strip():
        return "gone", ""
    return "deleting", out.stderr.strip()[:200] or "finalizers pending"


KIND = Kind(
    name="k8s",
    title="Kubernetes objects that own AWS resources",
    list=list_objects,
    delete=delete_object,
    state=object_state,
)
