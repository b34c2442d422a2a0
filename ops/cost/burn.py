"""Live burn rate: what the kit costs per hour right now (running instances, FSx and EBS storage).

Ownership is the teardown's (one definition): kit-tagged instances, instances of kit EKS clusters, the
kit's FSx file systems and PVC volumes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fsdpkit.ops.aws import Aws
from fsdpkit.ops.cost import prices
from fsdpkit.ops.tags import PROJECT_TAG
from fsdpkit.ops.teardown.filters import ownership
from fsdpkit.ops.teardown.kinds import ebs_volumes, fsx
from fsdpkit.ops.teardown.model import Options
from fsdpkit.ops.teardown.scope import discover


@dataclass(frozen=True, kw_only=True)
class BurnItem:
    kind: str
    """instance, fsx or ebs."""
    name: str
    count: int
    usd_per_hour: float | None
    """None when no price is known (listed, never guessed)."""
    source: str
    detail: str = ""


@dataclass(kw_only=True)
class Burn:
    items: list[BurnItem] = field(default_factory=list)

    @property
    def usd_per_hour(self) -> float:
        return sum(i.usd_per_hour or 0.0 for i in self.items)

    @property
    def unpriced(self) -> list[BurnItem]:
        return [i for i in self.items if i.usd_per_hour is None]


def running_instances(aws: Aws, prefix: str, clusters: tuple[str, ...]) -> dict[str, int]:
    """instance type -> count of running instances the kit owns."""
    ec2 = aws.client("ec2")
    seen: dict[str, str] = {}
    queries = [[{"Name": f"tag:{PROJECT_TAG}", "Values": [prefix]}]]
    queries += [[{"Name": "tag:eks:cluster-name", "Values": [c]}] for c in clusters]
    for q in queries:
        filters = [*q, {"Name": "instance-state-name", "Values": ["running"]}]
        for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for res in page["Reservations"]:
                for inst in res["Instances"]:
                    seen[inst["InstanceId"]] = inst["InstanceType"]
    counts: dict[str, int] = {}
    for itype in seen.values():
        counts[itype] = counts.get(itype, 0) + 1
    return counts


def get_burn(aws: Aws, prefix: str) -> Burn:
    scope = discover(aws, prefix, Options())
    burn = Burn()
    for itype, n in sorted(running_instances(aws, prefix, scope.clusters).items()):
        p = prices.ec2_hourly(aws, itype, aws.region)
        burn.items.append(
            BurnItem(
                kind="instance",
                name=itype,
                count=n,
                usd_per_hour=None if p.usd is None else p.usd * n,
                source=p.source,
                detail=f"{p.usd} USD/h each" if p.usd is not None else "no price found",
            )
        )
    hours = prices.hours_per_month()
    for r in fsx.list_file_systems(aws, scope):
        if ownership(r, scope) is None:
            continue
        fs = aws.client("fsx").describe_file_systems(FileSystemIds=[r.id])["FileSystems"]
        lustre = fs[0].get("LustreConfiguration", {}) if fs else {}
        p = prices.fsx_gb_month(
            aws.region, lustre.get("DeploymentType", ""), lustre.get("PerUnitStorageThroughput")
        )
        gib = int(r.detail.get("storage_gib") or 0)
        burn.items.append(
            BurnItem(
                kind="fsx",
                name=r.id,
                count=1,
                usd_per_hour=None if p.usd is None else p.usd * gib / hours,
                source=p.source,
                detail=f"{gib} GiB {lustre.get('DeploymentType', '?')}",
            )
        )
    for r in ebs_volumes.list_volumes(aws, scope):
        vol = aws.client("ec2").describe_volumes(VolumeIds=[r.id])["Volumes"][0]
        p = prices.ebs_gb_month(aws.region, vol.get("VolumeType", "gp3"))
        burn.items.append(
            BurnItem(
                kind="ebs",
                name=r.id,
                count=1,
                usd_per_hour=None if p.usd is None else p.usd * vol["Size"] / hours,
                source=p.source,
                detail=f"{vol['Size']} GiB {vol.get('VolumeType')}",
            )
        )
    return burn
