"""FSx for Lustre: the kit's file system and those the FSx CSI driver provisioned dynamically (pitfall 8).

A final backup is taken by default for persistent deployment types (they hold the checkpoints; the backup is
tagged kit:project and kept, so nothing is lost); `--no-fsx-backup` skips it. SCRATCH types cannot back up.
FSx has no DELETED state and botocore has no FSx waiter: poll until the file system is no longer described.
Its ENIs block the subnets.
"""

from __future__ import annotations

from fsdpkit.ops.aws import Aws
from fsdpkit.ops.tags import PROJECT_TAG, STACK_TAG, tag_dict
from fsdpkit.ops.teardown.filters import ownership
from fsdpkit.ops.teardown.model import Kind, Resource, Scope, State


def list_file_systems(aws: Aws, scope: Scope) -> list[Resource]:
    fsx = aws.client("fsx")
    found = []
    for page in fsx.get_paginator("describe_file_systems").paginate():
        for fs in page["FileSystems"]:
            t = tag_dict(fs.get("Tags"))
            deployment = fs.get("LustreConfiguration", {}).get("DeploymentType", "")
            backup = scope.options.fsx_backup and deployment.startswith("PERSISTENT")
            r = Resource(
                kind="fsx",
                id=fs["FileSystemId"],
                name=t.get("Name", t.get("CSIVolumeName", "")),
                tags=t,
                detail={
                    "vpc_id": fs.get("VpcId"),
                    "subnet_ids": tuple(fs.get("SubnetIds", ())),
                    "type": fs.get("FileSystemType"),
                    "deployment": deployment,
                    "note": "final backup first (kept)" if backup else "no final backup",
                    "storage_gib": fs.get("StorageCapacity"),
                },
            )
            in_vpc = r.detail["vpc_id"] in scope.vpcs or set(r.detail["subnet_ids"]) & set(scope.subnets)
            if in_vpc or ownership(r, scope) is not None:
                found.append(r)
    return found


def delete_file_system(aws: Aws, r: Resource, scope: Scope) -> None:
    fsx = aws.client("fsx")
    if r.detail["type"] != "LUSTRE":
        fsx.delete_file_system(FileSystemId=r.id)
        return
    persistent = str(r.detail["deployment"]).startswith("PERSISTENT")
    backup = scope.options.fsx_backup and persistent
    config: dict[str, object] = {"SkipFinalBackup": not backup}
    if backup:
        config["FinalBackupTags"] = [
            {"Key": PROJECT_TAG, "Value": scope.prefix},
            {"Key": STACK_TAG, "Value": r.tags.get(STACK_TAG, "final-backup")},
        ]
    fsx.delete_file_system(FileSystemId=r.id, LustreConfiguration=config)


def file_system_state(aws: Aws, r: Resource) -> tuple[State, str]:
    systems = aws.client("fsx").describe_file_systems(FileSystemIds=[r.id])["FileSystems"]
    if not systems:
        return "gone", ""
    life = systems[0].get("Lifecycle", "")
    if life == "FAILED":
        reason = systems[0].get("FailureDetails", {}).get("Message", "")
        return "failed", f"Lifecycle FAILED: {reason}"
    return "deleting", life


KIND = Kind(
    name="fsx",
    title="FSx file systems",
    list=list_file_systems,
    delete=delete_file_system,
    state=file_system_state,
)
