"""Kubernetes objects that own AWS resources, deleted first through kubectl while the cluster answers.

Jobs (the trainer gets SIGTERM and its grace period to finish a checkpoint), Services of type LoadBalancer and
Ingresses (the Load Balancer Controller then deletes its LBs, target groups and SGs), and PVCs (the CSI
drivers delete EBS volumes / FSx file systems whose reclaim policy is Delete). Only in the kit's own
namespaces (labelled `app.kubernetes.io/managed-by=kit`, never `default` or `kube-*`; ops/teardown/kube.py):
on a shared cluster the other namespaces hold other teams' work, listed as kept with the reason. The
kubeconfig context is the one whose server is the cluster's endpoint (`aws eks update-kubeconfig --name
<cluster>` creates it), found once at the start.
"""

from __future__ import annotations

import json

from fsdpkit.ops.aws import Aws
from fsdpkit.ops.teardown.kube import MANAGED_BY, MANAGED_BY_LABEL, SHARED_NAMESPACES, kubectl
from fsdpkit.ops.teardown.model import ClusterFacts, DeleteFailed, Kind, Resource, Scope, State, Unavailable

OBJECT_KINDS = "jobs.batch,services,ingresses.networking.k8s.io,persistentvolumeclaims"


def foreign_namespace(namespace: str, facts: ClusterFacts) -> str | None:
    """Why an object in `namespace` is not teardown's to delete, or None when the namespace is the kit's."""
    if namespace in facts.namespaces:
        return None
    if namespace in SHARED_NAMESPACES:
        return f"namespace {namespace} is shared, never the kit's alone: not deleted (goes with its cluster)"
    return (
        f"namespace {namespace} is not the kit's (no label {MANAGED_BY_LABEL}={MANAGED_BY}): not deleted "
        "(it goes with its cluster)"
    )


def list_objects(aws: Aws, scope: Scope) -> list[Resource]:
    if not scope.clusters:
        return []
    unread = sorted((c, why) for c, why in scope.kube_unread.items() if c in scope.clusters)
    if unread:
        cluster, why = unread[0]
        raise Unavailable(
            f"cluster {cluster}: {why}; Kubernetes objects are not deleted first "
            "(the AWS sweep below still removes what their controllers left)"
        )
    found = []
    for cluster in scope.clusters:
        facts = scope.kube.get(cluster)
        if facts is None:  # discovered without being read (a Scope built elsewhere): nothing is known of it
            raise Unavailable(f"cluster {cluster} was not read at the start: Kubernetes objects not deleted")
        args = ("--context", facts.context, "get", OBJECT_KINDS, "--all-namespaces", "-o", "json")
        out = kubectl(scope.options.kubectl, *args)
        if out.returncode != 0:
            raise Unavailable(f"cluster {cluster} does not answer: {out.stderr.strip()[:200]}")
        for item in json.loads(out.stdout).get("items", []):
            kind = item["kind"]
            if kind == "Service" and item.get("spec", {}).get("type") != "LoadBalancer":
                continue
            meta = item["metadata"]
            ref = f"{kind.lower()}/{meta['name']}"
            namespace = meta.get("namespace", "")
            found.append(
                Resource(
                    kind="k8s",
                    id=f"{cluster}:{namespace}:{ref}",
                    name=ref,
                    tags=meta.get("labels") or {},
                    detail={
                        "k8s_cluster": cluster,
                        "context": facts.context,
                        "kubectl": scope.options.kubectl,
                        "namespace": namespace,
                        "ref": ref,
                        "keep_reason": foreign_namespace(namespace, facts),
                    },
                )
            )
    return found


def _args(r: Resource) -> list[str]:
    return ["--context", r.detail["context"], "-n", r.detail["namespace"], r.detail["ref"]]


def delete_object(aws: Aws, r: Resource, scope: Scope) -> None:
    if r.detail.get("keep_reason"):  # never reached through plan(); a guard should a caller skip it
        raise DeleteFailed(str(r.detail["keep_reason"]))
    out = kubectl(scope.options.kubectl, "delete", *_args(r), "--wait=false", "--ignore-not-found")
    if out.returncode != 0:
        raise DeleteFailed(f"kubectl delete {r.detail['ref']}: {out.stderr.strip()[:200]}")


def object_state(aws: Aws, r: Resource) -> tuple[State, str]:
    out = kubectl(r.detail["kubectl"], "get", *_args(r), "-o", "name", "--ignore-not-found")
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
