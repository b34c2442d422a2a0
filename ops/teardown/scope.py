"""Find the kit's clusters and VPCs once at the start: later steps attribute controller resources to them.

Both by tag and by the kit stacks' resources (a resource CloudFormation created in a kit stack is the kit's
even when a tag did not propagate or was removed).
"""

from __future__ import annotations

from ops.aws import Aws
from ops.tags import PROJECT_TAG
from ops.teardown.model import Options, Scope

STACK_CLUSTER_TYPES = ("AWS::EKS::Cluster", "Custom::AWSCDK-EKS-Cluster")


def stack_resources(aws: Aws, prefix: str) -> dict[str, str]:
    """Physical id -> resource type of every resource in the kit's stacks (blank rows skipped)."""
    cfn = aws.client("cloudformation")
    found: dict[str, str] = {}
    for page in cfn.get_paginator("describe_stacks").paginate():
        for s in page["Stacks"]:
            tags = {t["Key"]: t["Value"] for t in s.get("Tags", [])}
            if tags.get(PROJECT_TAG) != prefix or s["StackStatus"] == "DELETE_COMPLETE":
                continue
            for rpage in cfn.get_paginator("list_stack_resources").paginate(StackName=s["StackId"]):
                for r in rpage["StackResourceSummaries"]:
                    if r.get("PhysicalResourceId") and r.get("ResourceType"):
                        found[r["PhysicalResourceId"]] = r["ResourceType"]
    return found


def discover(aws: Aws, prefix: str, options: Options) -> Scope:
    in_stacks = stack_resources(aws, prefix)
    eks = aws.client("eks")
    clusters: list[str] = []
    endpoints: dict[str, str] = {}
    for page in eks.get_paginator("list_clusters").paginate():
        for name in page["clusters"]:
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
    return Scope(
        prefix=prefix,
        region=aws.region,
        account=aws.account_id(),
        clusters=tuple(sorted(clusters)),
        cluster_endpoints=endpoints,
        vpcs=tuple(sorted(vpcs)),
        subnets=tuple(sorted(subnets)),
        stack_resources=frozenset(in_stacks),
        options=options,
    )
