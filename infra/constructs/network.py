"""The VPC and the EFA security group."""

from __future__ import annotations

from aws_cdk import RemovalPolicy, Stack, Tags
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

from fsdpkit.infra.config import NetworkConfig

PRIVATE_SUBNET_MASK = 18
"""/18 per AZ: the VPC CNI gives every pod a VPC address."""
PUBLIC_SUBNET_MASK = 24


class Network(Construct):
    """VPC over the configured AZs (public /24 for NAT, private-with-egress /18), S3 endpoint, flow logs.

    The EFA security group lives here so that both storage (FSx) and the cluster can reference it
    without a cycle between their stacks.
    """

    def __init__(self, scope: Construct, construct_id: str, *, cfg: NetworkConfig) -> None:
        super().__init__(scope, construct_id)
        log_key = kms.Key(
            self,
            "FlowLogKey",
            enable_key_rotation=True,
            description="VPC flow log encryption",
            removal_policy=RemovalPolicy.DESTROY,
        )
        log_key.grant_encrypt_decrypt(iam.ServicePrincipal(f"logs.{Stack.of(self).region}.amazonaws.com"))
        flow_log_group = logs.LogGroup(
            self,
            "FlowLogs",
            retention=logs.RetentionDays.ONE_MONTH,
            encryption_key=log_key,
            removal_policy=RemovalPolicy.DESTROY,
        )
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(cfg.vpc_cidr),
            availability_zones=list(cfg.availability_zones),
            nat_gateways=cfg.nat_gateways,
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=PUBLIC_SUBNET_MASK
                ),
                ec2.SubnetConfiguration(
                    name="private",
                    subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                    cidr_mask=PRIVATE_SUBNET_MASK,
                ),
            ],
            gateway_endpoints={
                "S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3)
            },
            flow_logs={
                "All": ec2.FlowLogOptions(
                    destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group),
                    traffic_type=ec2.FlowLogTrafficType.ALL,
                )
            },
        )
        # Subnet role tags let the AWS Load Balancer Controller find subnets, should a user add it.
        for subnet in self.vpc.public_subnets:
            Tags.of(subnet).add("kubernetes.io/role/elb", "1")
        for subnet in self.vpc.private_subnets:
            Tags.of(subnet).add("kubernetes.io/role/internal-elb", "1")

        self.efa_security_group = EfaSecurityGroup(self, "Efa", vpc=self.vpc).security_group

    def private_subnet_in(self, availability_zone: str) -> ec2.ISubnet:
        """The private subnet of one AZ (GPU nodes and FSx share it)."""
        selected = self.vpc.select_subnets(
            subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, availability_zones=[availability_zone]
        )
        return selected.subnets[0]


class EfaSecurityGroup(Construct):
    """Security group for EFA traffic: all traffic to and from itself, nothing else by default.

    EFA's OS-bypass traffic needs all protocols between members; with no default egress, anything
    else the members reach through this group (FSx) gets an explicit rule from the storage construct.
    """

    def __init__(self, scope: Construct, construct_id: str, *, vpc: ec2.IVpc) -> None:
        super().__init__(scope, construct_id)
        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=vpc,
            allow_all_outbound=False,
            description="EFA: all traffic between GPU nodes (self-referencing ingress and egress)",
        )
        self.security_group.add_ingress_rule(
            self.security_group, ec2.Port.all_traffic(), "EFA traffic from other GPU nodes"
        )
        self.security_group.add_egress_rule(
            self.security_group, ec2.Port.all_traffic(), "EFA traffic to other GPU nodes"
        )
