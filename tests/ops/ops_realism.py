"""AWS's answers where moto is lenient, as fault-proxy rules (reference §1, "✗" rows).

moto deletes a security group, subnet or VPC that something still uses, deletes a load balancer with
deletion protection on, keeps a terminated instance's primary ENI attached, and always ends `delete_stack` in
DELETE_COMPLETE. `AwsRealism(proxy, world)` installs rules that answer as AWS does:

- DeleteSecurityGroup while an ENI, a load balancer or another group's rule uses it: DependencyViolation;
- DeleteSubnet / DeleteVpc while ENIs, load balancers or instances (and, for a VPC, subnets or groups) are
  in it: DependencyViolation;
- DeleteLoadBalancer with deletion protection on: OperationNotPermitted;
- TerminateInstances also deletes the instances' primary ENIs (DeleteOnTermination, as AWS does);
- DeleteStack of a stack whose VPC, subnet or security group is still used by something outside the stack
  (or with any extra blocker a test registers, e.g. a non-empty bucket): the stack ends DELETE_FAILED,
  `describe_stacks` says so and `describe_stack_events` gives one DELETE_FAILED event per blocked resource
  with AWS's wording. Once nothing blocks it any more, the next DeleteStack reaches moto and deletes it.

Inspection goes to moto directly (the world's clients), never through the proxy.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field

from ops_fakeaws import FaultProxy, Request, Response, Rule, error_response
from ops_world import World

Blocker = tuple[str, str, str]
"""(logical id, resource type, AWS's reason) of a stack resource that could not be deleted."""

OK_DELETE_STACK = (
    b"<DeleteStackResponse><ResponseMetadata><RequestId>inj</RequestId></ResponseMetadata>"
    b"</DeleteStackResponse>"
)
EVENT = (
    "<member><StackId>{sid}</StackId><EventId>{n}</EventId><StackName>{name}</StackName>"
    "<LogicalResourceId>{lid}</LogicalResourceId><ResourceType>{type}</ResourceType>"
    "<Timestamp>2026-01-01T00:00:{n:02d}Z</Timestamp><ResourceStatus>{status}</ResourceStatus>"
    "<ResourceStatusReason>{why}</ResourceStatusReason></member>"
)


@dataclass
class AwsRealism:
    proxy: FaultProxy
    world: World
    failed: dict[str, tuple[str, list[Blocker]]] = field(default_factory=dict)
    """Stack id -> (stack name, blockers of its last delete attempt): stacks moto would have deleted."""
    extra: dict[str, Callable[[], list[Blocker]]] = field(default_factory=dict)
    """Stack name -> more blockers (e.g. a bucket that is not empty)."""
    refusals: dict[str, int] = field(default_factory=dict)
    """How often each rule refused: proves the run went through AWS's refusals, not around them."""

    def __post_init__(self) -> None:
        ec2 = "ec2"
        self._refuse(ec2, "DeleteSecurityGroup", lambda r: self.sg_users(r.params["GroupId"]))
        self._refuse(ec2, "DeleteSubnet", lambda r: self.subnet_users(r.params["SubnetId"]))
        self._refuse(ec2, "DeleteVpc", lambda r: self.vpc_users(r.params["VpcId"]))
        self.proxy.add(
            Rule(
                "elasticloadbalancing",
                "DeleteLoadBalancer",
                lambda req, fwd: self._count(
                    "DeleteLoadBalancer",
                    error_response(
                        "elasticloadbalancing",
                        "OperationNotPermitted",
                        f"Load balancer '{req.params['LoadBalancerArn']}' cannot be deleted because "
                        "deletion protection is enabled",
                        400,
                    ),
                ),
                when=lambda r: self.lb_protected(r.params["LoadBalancerArn"]),
            )
        )
        self.proxy.add(Rule(ec2, "TerminateInstances", self._terminate))
        self.proxy.add(Rule("cloudformation", "DeleteStack", self._delete_stack))
        self.proxy.add(
            Rule("cloudformation", "DescribeStacks", self._describe_stacks, when=lambda r: bool(self.failed))
        )
        self.proxy.add(
            Rule(
                "cloudformation",
                "DescribeStackEvents",
                self._events,
                when=lambda r: self._failed_id(r.params.get("StackName", "")) is not None,
            )
        )

    # -- what AWS checks -----------------------------------------------------------------------------------
    def _c(self, svc: str):
        return self.world.client(svc)

    def _lbs(self) -> list[dict]:
        return self._c("elbv2").describe_load_balancers()["LoadBalancers"]

    def _enis(self, name: str, value: str) -> list[str]:
        enis = self._c("ec2").describe_network_interfaces(Filters=[{"Name": name, "Values": [value]}])
        return [e["NetworkInterfaceId"] for e in enis["NetworkInterfaces"]]

    def _instances(self, name: str, value: str) -> list[str]:
        live = {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}
        pages = self._c("ec2").describe_instances(Filters=[{"Name": name, "Values": [value]}, live])
        return [i["InstanceId"] for r in pages["Reservations"] for i in r["Instances"]]

    def sg_users(self, group_id: str, inside: frozenset[str] = frozenset()) -> list[str]:
        users = self._enis("group-id", group_id)
        users += [lb["LoadBalancerArn"] for lb in self._lbs() if group_id in lb.get("SecurityGroups", [])]
        for g in self._c("ec2").describe_security_groups()["SecurityGroups"]:
            if g["GroupId"] == group_id:
                continue
            for perm in g.get("IpPermissions", []) + g.get("IpPermissionsEgress", []):
                if any(p.get("GroupId") == group_id for p in perm.get("UserIdGroupPairs", [])):
                    users.append(g["GroupId"])
        return [u for u in users if u not in inside]

    def subnet_users(self, subnet_id: str, inside: frozenset[str] = frozenset()) -> list[str]:
        users = self._enis("subnet-id", subnet_id) + self._instances("subnet-id", subnet_id)
        users += [
            lb["LoadBalancerArn"]
            for lb in self._lbs()
            if any(z.get("SubnetId") == subnet_id for z in lb.get("AvailabilityZones", []))
        ]
        return [u for u in users if u not in inside]

    def vpc_users(self, vpc_id: str, inside: frozenset[str] = frozenset()) -> list[str]:
        ec2 = self._c("ec2")
        in_vpc = [{"Name": "vpc-id", "Values": [vpc_id]}]
        users = [s["SubnetId"] for s in ec2.describe_subnets(Filters=in_vpc)["Subnets"]]
        users += [
            g["GroupId"]
            for g in ec2.describe_security_groups(Filters=in_vpc)["SecurityGroups"]
            if g["GroupName"] != "default"
        ]
        users += self._enis("vpc-id", vpc_id) + self._instances("vpc-id", vpc_id)
        users += [lb["LoadBalancerArn"] for lb in self._lbs() if lb.get("VpcId") == vpc_id]
        return [u for u in users if u not in inside]

    def lb_protected(self, arn: str) -> bool:
        try:
            attrs = self._c("elbv2").describe_load_balancer_attributes(LoadBalancerArn=arn)["Attributes"]
        except self._c("elbv2").exceptions.LoadBalancerNotFoundException:
            return False
        return any(a["Key"] == "deletion_protection.enabled" and a["Value"] == "true" for a in attrs)

    def stack_blockers(self, stack: str) -> list[Blocker]:
        """What AWS would fail on when deleting this stack: resources still used from outside it."""
        rows = self._c("cloudformation").list_stack_resources(StackName=stack)["StackResourceSummaries"]
        inside = frozenset(r.get("PhysicalResourceId", "") for r in rows)
        checks = {
            "AWS::EC2::SecurityGroup": (self.sg_users, "resource {id} has a dependent object"),
            "AWS::EC2::Subnet": (
                self.subnet_users,
                "The subnet '{id}' has dependencies and cannot be deleted.",
            ),
            "AWS::EC2::VPC": (self.vpc_users, "The vpc '{id}' has dependencies and cannot be deleted."),
        }
        blockers = []
        for r in rows:
            check = checks.get(r.get("ResourceType", ""))
            pid = r.get("PhysicalResourceId", "")
            if check and pid and check[0](pid, inside):
                why = (
                    check[1].format(id=pid) + " (Service: Ec2, Status Code: 400, Error: DependencyViolation)"
                )
                blockers.append((r["LogicalResourceId"], r["ResourceType"], why))
        return blockers

    # -- rules ---------------------------------------------------------------------------------------------
    def _count(self, what: str, resp: Response) -> Response:
        self.refusals[what] = self.refusals.get(what, 0) + 1
        return resp

    def _refuse(self, svc: str, action: str, users: Callable[[Request], list[str]]) -> None:
        def respond(req: Request, fwd: Callable[[], Response]) -> Response:
            using = users(req)
            if not using:
                return fwd()
            msg = f"resource has a dependent object ({', '.join(using[:3])})"
            return self._count(action, error_response(svc, "DependencyViolation", msg, 400))

        self.proxy.add(Rule(svc, action, respond))

    def _terminate(self, req: Request, fwd: Callable[[], Response]) -> Response:
        ids = [v for k, v in req.params.items() if k.startswith("InstanceId.")]
        ec2 = self._c("ec2")
        pages = ec2.describe_instances(InstanceIds=ids)["Reservations"] if ids else []
        enis = [
            n["NetworkInterfaceId"] for r in pages for i in r["Instances"] for n in i["NetworkInterfaces"]
        ]
        resp = fwd()
        if resp.status == 200:
            for eni in enis:  # AWS deletes a primary ENI with its instance; moto keeps it attached
                ec2.delete_network_interface(NetworkInterfaceId=eni)
        return resp

    def _resolve(self, name_or_id: str) -> tuple[str, str] | None:
        try:
            s = self._c("cloudformation").describe_stacks(StackName=name_or_id)["Stacks"][0]
        except self._c("cloudformation").exceptions.ClientError:
            return None
        return s["StackId"], s["StackName"]

    def _failed_id(self, name_or_id: str) -> str | None:
        return next((sid for sid, (n, _) in self.failed.items() if name_or_id in (sid, n)), None)

    def _delete_stack(self, req: Request, fwd: Callable[[], Response]) -> Response:
        found = self._resolve(req.params.get("StackName", ""))
        if found is None:
            return fwd()
        sid, name = found
        blockers = self.stack_blockers(sid) + (self.extra[name]() if name in self.extra else [])
        if not blockers:
            self.failed.pop(sid, None)
            return fwd()
        self.failed[sid] = (name, blockers)
        return self._count("DeleteStack", Response(200, {"Content-Type": "text/xml"}, OK_DELETE_STACK))

    def _describe_stacks(self, req: Request, fwd: Callable[[], Response]) -> Response:
        resp = fwd()
        if resp.status != 200:
            return resp
        root = ET.fromstring(resp.body)
        ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
        for member in root.iter(f"{ns}member"):
            sid, status = member.find(f"{ns}StackId"), member.find(f"{ns}StackStatus")
            if sid is not None and status is not None and sid.text in self.failed:
                status.text = "DELETE_FAILED"
        if ns:
            ET.register_namespace("", ns.strip("{}"))
        return Response(200, resp.headers, ET.tostring(root))

    def _events(self, req: Request, fwd: Callable[[], Response]) -> Response:
        sid = self._failed_id(req.params["StackName"])
        assert sid is not None
        name, blockers = self.failed[sid]
        n = len(blockers) + 2
        members = EVENT.format(
            sid=sid,
            n=n,
            name=name,
            lid=name,
            type="AWS::CloudFormation::Stack",
            status="DELETE_FAILED",
            why="The following resource(s) failed to delete: " + ", ".join(b[0] for b in blockers),
        )
        for i, (lid, rtype, why) in enumerate(blockers):
            members += EVENT.format(
                sid=sid, n=n - 1 - i, name=name, lid=lid, type=rtype, status="DELETE_FAILED", why=why
            )
        members += EVENT.format(
            sid=sid,
            n=1,
            name=name,
            lid=name,
            type="AWS::CloudFormation::Stack",
            status="DELETE_IN_PROGRESS",
            why="User Initiated",
        )
        body = (
            f"<DescribeStackEventsResponse><DescribeStackEventsResult><StackEvents>{members}</StackEvents>"
            "</DescribeStackEventsResult></DescribeStackEventsResponse>"
        )
        return Response(200, {"Content-Type": "text/xml"}, body.encode())
