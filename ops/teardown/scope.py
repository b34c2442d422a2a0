"""Find the kit's clusters and VPCs once at the start: later steps attribute controller resources to them.

Both by tag and by the kit stacks' resources (a resource CloudFormation created in a kit stack is the kit's
even when a tag did not propagate or was removed). Cluster names the kit's stacks recorded (an EKS
cluster resource, the `ClusterName` output) are read from deleted stacks' outputs too, so ownership of what a
cluster's controllers made does not depend on the cluster itself, which teardown deletes. A deleted stack's
deletion time bounds that evidence: a later cluster that reuses the name (not the kit's) made what it made
after it (filters.former_owner). What a user kept inside each live kit cluster (its namespaces, its
PersistentVolumes' reclaim policies) is read here too, through kubectl, before step 1 deletes any claim.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

import botocore.exceptions

from fsdpkit.ops.aws import Aws
from fsdpkit.ops.tags import PROJECT_TAG
from fsdpkit.ops.teardown.kube import read_clusters
from fsdpkit.ops.teardown.model import Options, Scope

STACK_CLUSTER_TYPES = ("AWS::EKS::Cluster", "Custom::AWSCDK-EKS-Cluster")
CLUSTER_OUTPUT = "ClusterName"
"""The cluster stack's output naming the cluster (contract 2, infra/stacks/cluster_stack.py)."""


@dataclass
class StackRecords:
    resources: dict[str, str] = field(default_factory=dict)
    """Physical id -> resource type of every resource in the kit's live stacks (blank rows skipped)."""
    contents: dict[str, str] = field(default_factory=dict)
    """Live stack name -> what it holds, by type ("AWS::EC2::VPC x1, ...")."""
    clusters: set[str] = field(default_factory=set)
    """Cluster names recorded by kit stacks, live or deleted."""
    deleted_at: dict[str, datetime] = field(default_factory=dict)
    """Cluster name -> when the last deleted kit stack that named it was deleted (only names no live kit
    stack records, and only where CloudFormation gave the time)."""


def _recorded_clusters(stack: dict) -> set[str]:
    return {o["OutputValue"] for o in stack.get("Outputs", []) if o.get("OutputKey") == CLUSTER_OUTPUT}


def _read_live_stack(aws: Aws, stack: dict, records: StackRecords) -> None:
    cfn = aws.client("cloudformation")
    records.clusters |= _recorded_clusters(stack)
    types: Counter[str] = Counter()
    for rpage in cfn.get_paginator("list_stack_resources").paginate(StackName=stack["StackId"]):
        for r in rpage["StackResourceSummaries"]:
            pid, rtype = r.get("PhysicalResourceId"), r.get("ResourceType")
            if not (pid and rtype):
                continue
            if rtype in STACK_CLUSTER_TYPES:
                records.clusters.add(pid)
            records.resources[pid] = rtype
            types[rtype] += 1
    records.contents[stack["StackName"]] = ", ".join(f"{t} x{n}" for t, n in sorted(types.items()))


def stack_records(aws: Aws, prefix: str) -> StackRecords:
    """What the kit's stacks hold now, and the clusters they ever named (deleted stacks: 90 days)."""
    cfn = aws.client("cloudformation")
    records = StackRecords()
    for page in cfn.get_paginator("describe_stacks").paginate():
        for s in page["Stacks"]:
            tags = {t["Key"]: t["Value"] for t in s.get("Tags", [])}
            if tags.get(PROJECT_TAG) == prefix and s["StackStatus"] != "DELETE_COMPLETE":
                _read_live_stack(aws, s, records)
    # Deleted stacks keep their tags and outputs; kit stack names start with the prefix (infra names them
    # `<prefix>-<Part>`), which bounds the describe calls to the kit's own. Only the outputs are read: the
    # cluster stack names its cluster there (and moto re-creates a deleted stack's resources when they
    # are listed).
    named_live = set(records.clusters)
    for page in cfn.get_paginator("list_stacks").paginate(StackStatusFilter=["DELETE_COMPLETE"]):
        for summary in page["StackSummaries"]:
            if not summary["StackName"].startswith(prefix):
                continue
            try:
                s = cfn.describe_stacks(StackName=summary["StackId"])["Stacks"][0]
            except botocore.exceptions.ClientError:
                continue  # an unreadable old record only loses this extra evidence; live tags still count
            if {t["Key"]: t["Value"] for t in s.get("Tags", [])}.get(PROJECT_TAG) != prefix:
                continue
            named = _recorded_clusters(s)
            records.clusters |= named
            when = summary.get("DeletionTime") or s.get("DeletionTime")
            for name in named - named_live if when else ():
                records.deleted_at[name] = max(when, records.deleted_at.get(name, when))
    return records


def discover(aws: Aws, prefix: str, options: Options) -> Scope:
    records = stack_records(aws, prefix)
    in_stacks = records.resources
    eks = aws.client("eks")
    clusters: list[str] = []
    live: set[str] = set()
    endpoints: dict[str, str] = {}
    for page in eks.get_paginator("list_clusters").paginate():
        for name in page["clusters"]:
            live.add(name)
            c = eks.describe_cluster(name=name)["cluster"]
            if (c.get("tags") or {}).get(PROJECT_TAG) == prefix or in_stacks.get(name) in STACK_CLUSTER_TYPES:
                clusters.append(name)
                endpoints[name] = c.get("endpoint", "")
    ec2 = aws.client("ec2")
    vpcs = [
        v["VpcId"]
        for page in ec2.get_paginator("describe_vpcs").paginate(
            Filters=[{"Name": f"tag:{PROJECT_TAG}", "Values": [prefix]}]
        )
        for v in page["Vpcs"]
    ]
    vpcs = sorted(set(vpcs) | {pid for pid, t in in_stacks.items() if t == "AWS::EC2::VPC"})
    subnets = []
    if vpcs:
        pages = ec2.get_paginator("describe_subnets").paginate(Filters=[{"Name": "vpc-id", "Values": vpcs}])
        subnets = [s["SubnetId"] for page in pages for s in page["Subnets"]]
    # what a user kept inside each live kit cluster, read before step 1 deletes claims (kube.py)
    kube, kube_unread = read_clusters(options.kubectl, endpoints)
    return Scope(
        prefix=prefix,
        region=aws.region,
        account=aws.account_id(),
        clusters=tuple(sorted(clusters)),
        # a name reused by a cluster alive now (kit or not) is that cluster's, not a former kit cluster's
        former_clusters=tuple(sorted(records.clusters - live)),
        former_deleted_at={c: t for c, t in records.deleted_at.items() if c not in live},
        cluster_endpoints=endpoints,
        vpcs=tuple(sorted(vpcs)),
        subnets=tuple(sorted(subnets)),
        stack_resources=frozenset(in_stacks),
        stack_contents=records.contents,
        kube=kube,
        kube_unread=kube_unread,
        options=options,
    )
