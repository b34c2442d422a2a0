"""FSx for Lustre in the GPU nodes' subnet, optionally linked to an S3 bucket."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_kms as kms
from constructs import Construct

from fsdpkit.infra.config import StorageConfig

DATA_PATH = "/data"
"""Where the linked S3 bucket appears in the file system."""

_DEPLOYMENT_TYPES = {
    "PERSISTENT_2": fsx.LustreDeploymentType.PERSISTENT_2,
    "PERSISTENT_1": fsx.LustreDeploymentType.PERSISTENT_1,
    "SCRATCH_2": fsx.LustreDeploymentType.SCRATCH_2,
}
_ALL_EVENTS = ["NEW", "CHANGED", "DELETED"]
LUSTRE_CLIENT_PORTS: tuple[tuple[int, int], ...] = ((988, 988), (1018, 1023))
"""Inbound TCP a Lustre client must accept from the file system's group (FSx for Lustre guide, "File system
access control with Amazon VPC": https://docs.aws.amazon.com/fsx/latest/LustreGuide/limit-access-security-groups.html)."""


def allow_lustre_callbacks(
    scope: Construct, *, client_group_id: str, fsx_group_id: str, references_digest: str | None = None
) -> None:
    """Inbound LUSTRE_CLIENT_PORTS on a client group from the file system's group (L1 rules in `scope`'s
    stack: `add_ingress_rule` on another stack's group would place them in that stack and make a cycle).

    From another stack, pass `references_digest` (of the FSx group, `fsdpkit.infra.references`): it goes into
    the rules' description, so a replaced FSx group changes them and the deploy points them at the new group.
    """
    description = "Lustre server callbacks to clients"
    if references_digest is not None:
        description += f" (fsx-sg {references_digest})"
    for low, high in LUSTRE_CLIENT_PORTS:
        ec2.CfnSecurityGroupIngress(
            scope,
            f"LustreCallbacks{low}",
            group_id=client_group_id,
            source_security_group_id=fsx_group_id,
            ip_protocol="tcp",
            from_port=low,
            to_port=high,
            description=description,
        )


LOG_LEVEL = "WARN_ERROR"
"""Lustre logging: warnings and errors to CloudWatch Logs (`/aws/fsx/lustre`), e.g. failed S3 exports."""


class Storage(Construct):
    """Encrypted, LZ4-compressed Lustre 2.15 file system for checkpoints and data.

    Kept when the stack is deleted (it holds checkpoints); `make teardown` removes it on confirmation.
    Clients reach it through the EFA security group (egress there, ingress on the file system's group),
    and accept the server's callbacks on TCP 988 and 1018-1023 from the file system's group. PERSISTENT_2
    gets an automatic metadata configuration and, with `efa_enabled`, EFA: the EFA group then joins the file
    system, and the file system's group allows all traffic within itself (the FSx guide's rule for EFA).
    `overrides` records the escape-hatch properties for `fsdpkit.infra.references`.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cfg: StorageConfig,
        vpc: ec2.IVpc,
        subnet: ec2.ISubnet,
        client_security_group: ec2.ISecurityGroup,
    ) -> None:
        super().__init__(scope, construct_id)
        self.key = self._encryption_key(cfg)
        self.file_system = self._file_system(cfg, vpc=vpc, subnet=subnet)
        self.file_system.connections.allow_default_port_from(
            client_security_group, "Lustre clients (GPU nodes)"
        )
        fsx_group = self.file_system.connections.security_groups[0]
        allow_lustre_callbacks(
            self,
            client_group_id=client_security_group.security_group_id,
            fsx_group_id=fsx_group.security_group_id,
        )
        self.overrides: dict[str, object] = {"LustreConfiguration.LogConfiguration": {"Level": LOG_LEVEL}}
        if cfg.deployment_type == "PERSISTENT_2":
            self.overrides["LustreConfiguration.MetadataConfiguration"] = {"Mode": "AUTOMATIC"}
        if cfg.efa_enabled:
            self.overrides.update(_enable_efa(fsx_group, client_security_group))
        self.cfn = self.file_system.node.default_child
        for path, value in self.overrides.items():
            self.cfn.add_property_override(path, value)

        self.data_repository_association: fsx.CfnDataRepositoryAssociation | None = None
        if cfg.s3_bucket is not None and cfg.deployment_type == "PERSISTENT_2":
            self.data_repository_association = self._bucket_link(cfg.s3_bucket)

    def _encryption_key(self, cfg: StorageConfig) -> kms.Key | None:
        """A retained customer key for PERSISTENT file systems (SCRATCH ones are always encrypted with an
        AWS-owned key)."""
        if not cfg.deployment_type.startswith("PERSISTENT"):
            return None
        return kms.Key(
            self,
            "Key",
            enable_key_rotation=True,
            description="FSx for Lustre encryption at rest (kept with the file system)",
            removal_policy=RemovalPolicy.RETAIN,
        )

    def _file_system(self, cfg: StorageConfig, *, vpc: ec2.IVpc, subnet: ec2.ISubnet) -> fsx.LustreFileSystem:
        """The file system; PERSISTENT_1 and SCRATCH_2 link a bucket by import and export paths."""
        link_by_path = cfg.s3_bucket is not None and cfg.deployment_type != "PERSISTENT_2"
        return fsx.LustreFileSystem(
            self,
            "FileSystem",
            vpc=vpc,
            vpc_subnet=subnet,
            storage_capacity_gib=cfg.storage_gib,
            file_system_type_version=fsx.FileSystemTypeVersion.V_2_15,
            kms_key=self.key,
            removal_policy=RemovalPolicy.RETAIN,
            lustre_configuration=fsx.LustreConfiguration(
                deployment_type=_DEPLOYMENT_TYPES[cfg.deployment_type],
                per_unit_storage_throughput=cfg.effective_throughput_per_tib,
                data_compression_type=fsx.LustreDataCompressionType.LZ4,
                import_path=f"s3://{cfg.s3_bucket}" if link_by_path else None,
                export_path=f"s3://{cfg.s3_bucket}" if link_by_path else None,
                auto_import_policy=fsx.LustreAutoImportPolicy.NEW_CHANGED_DELETED if link_by_path else None,
            ),
        )

    def _bucket_link(self, bucket: str) -> fsx.CfnDataRepositoryAssociation:
        """PERSISTENT_2 cannot use import/export paths; it links a bucket through an association."""
        return fsx.CfnDataRepositoryAssociation(
            self,
            "S3Link",
            file_system_id=self.file_system.file_system_id,
            file_system_path=DATA_PATH,
            data_repository_path=f"s3://{bucket}/",
            batch_import_meta_data_on_create=True,
            s3=fsx.CfnDataRepositoryAssociation.S3Property(
                auto_import_policy=fsx.CfnDataRepositoryAssociation.AutoImportPolicyProperty(
                    events=_ALL_EVENTS
                ),
                auto_export_policy=fsx.CfnDataRepositoryAssociation.AutoExportPolicyProperty(
                    events=_ALL_EVENTS
                ),
            ),
        )


def _enable_efa(fsx_group: ec2.ISecurityGroup, client_group: ec2.ISecurityGroup) -> dict[str, object]:
    """Open the file system's group to all traffic within itself; return the overrides that turn EFA on and
    add the EFA group to the file system.

    FSx guide, EFA-enabled file systems: every group of the file system allows all traffic within itself
    (the EFA group already does; egress here is open to all)."""
    fsx_group.connections.allow_internally(
        ec2.Port.all_traffic(), "EFA-enabled FSx: all traffic within the group"
    )
    return {
        "LustreConfiguration.EfaEnabled": True,
        "SecurityGroupIds": [fsx_group.security_group_id, client_group.security_group_id],
    }
