"""Find the kit's clusters and VPCs once at the start: later steps attribute controller resources to them."""

from __future__ import annotations

from ops.aws import Aws
from ops.tags import PROJECT_TAG
from ops.teardown.model import Options, Scope


def discover(aws: Aws, prefix: str, options: Options) -> Scope:
    eks = aws.client("eks")
    clusters: list[str] = []
    endpoints: dict[str, str] = {}
    for page in eks.get_paginator("list_clusters").paginate():
        for name in page["clusters"]:
            c = eks.describe_cluster(name=name)["cluster"]
            if (c.get("tags") or {}).get(PROJECT_TAG) == prefix:
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
        options=options,
    )
