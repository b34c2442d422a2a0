"""The kit's tag keys (contract 1) and the owner tags that Kubernetes controllers write.

The two kit keys duplicate `infra/tags.py` (the source of truth): `ops/` may import boto3 only, never
`infra/`. A test checks that both files agree while both exist.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

PROJECT_TAG = "kit:project"
"""Every resource the kit creates carries `kit:project=<prefix>` (same key as infra/tags.py)."""
STACK_TAG = "kit:stack"
"""... and `kit:stack=<stack name>` (same key as infra/tags.py)."""
KEEP_TAG = "kit:teardown"
"""Protection tag: `kit:teardown=keep` on a resource makes teardown keep it (exclude beats include)."""
KEEP_VALUE = "keep"
CLUSTER_TAG = "kit:cluster"
"""Teardown writes it (with the project tag) on controller-made resources before deleting their cluster."""


def tag_dict(items: object, key: str = "Key", value: str = "Value") -> dict[str, str]:
    """AWS returns tags as [{"Key": k, "Value": v}] (EC2, ELB, CFN, ECR, EKS node groups as a map)."""
    if isinstance(items, Mapping):
        return {str(k): str(v) for k, v in items.items()}
    if not items:
        return {}
    return {str(t[key]): str(t.get(value, "")) for t in items}  # type: ignore[union-attr]


def cluster_owner(tags: Mapping[str, str], clusters: tuple[str, ...]) -> str | None:
    """Which kit cluster's controller created this resource, as `key=value` evidence, or None.

    The AWS Load Balancer Controller writes `elbv2.k8s.aws/cluster=<c>`; the in-tree cloud provider and the
    EBS CSI driver (with --k8s-tag-cluster-id) write `kubernetes.io/cluster/<c>=owned` (and
    `KubernetesCluster=<c>`); the VPC CNI writes `cluster.k8s.amazonaws.com/name=<c>`; EKS managed node
    groups write `eks:cluster-name=<c>`. `kubernetes.io/cluster/<c>=shared` marks shared subnets, not
    ownership, so it is ignored.
    """
    for c in clusters:
        for key, expected in (
            ("elbv2.k8s.aws/cluster", c),
            (f"kubernetes.io/cluster/{c}", "owned"),
            ("KubernetesCluster", c),
            ("cluster.k8s.amazonaws.com/name", c),
            ("eks:cluster-name", c),
        ):
            if tags.get(key) == expected:
                return f"{key}={expected}"
    return None


PREFIX_RE = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,62}")
"""A kit prefix: it starts CloudFormation stack names (`<Prefix>-Network`), so the same rule applies."""


def prefix_error(prefix: str) -> str | None:
    """Why a prefix is invalid, or None."""
    if PREFIX_RE.fullmatch(prefix):
        return None
    return f"--prefix must be a letter then letters, digits or '-' (max 63), got {prefix!r}"
