"""A stack that carries the kit's tags (contract 1) on itself and on every taggable resource."""

from __future__ import annotations

import jsii
from aws_cdk import Aspects, CfnResource, Environment, IAspect, Stack, TagManager, Tags
from constructs import Construct, IConstruct

from fsdpkit.infra.config import KitConfig
from fsdpkit.infra.tags import PROJECT_TAG, STACK_TAG


class KitStack(Stack):
    """Stack named `<prefix>-<suffix>`, tagged `kit:project=<prefix>` and `kit:stack=<stack name>`.

    The tags go both on the stack (CloudFormation propagates them at deploy) and on each resource in the
    template (visible to tests and to resources CloudFormation does not propagate to).
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, cfg: KitConfig, suffix: str, description: str
    ) -> None:
        name = f"{cfg.prefix}-{suffix}"
        self.kit_tags = {PROJECT_TAG: cfg.prefix, STACK_TAG: name}
        super().__init__(
            scope,
            construct_id,
            stack_name=name,
            env=Environment(account=cfg.account, region=cfg.region),
            description=description,
            tags=self.kit_tags,
        )
        for key, value in self.kit_tags.items():
            Tags.of(self).add(key, value)
        Aspects.of(self).add(TagRawResources(self.kit_tags))


@jsii.implements(IAspect)
class TagRawResources:
    """Tag the raw `CfnResource`s that aws-cdk-lib's own custom-resource providers create.

    The tag aspect only reaches L1 classes; the VPC default-security-group provider's role and function are
    plain `CfnResource`s, so they get the kit's tags as a property override.
    """

    TAGGABLE = ("AWS::IAM::Role", "AWS::Lambda::Function")

    def __init__(self, tags: dict[str, str]) -> None:
        self.tags = [{"Key": k, "Value": v} for k, v in sorted(tags.items())]

    def visit(self, node: IConstruct) -> None:
        if (
            isinstance(node, CfnResource)
            and node.cfn_resource_type in self.TAGGABLE
            and not TagManager.is_taggable(node)
        ):
            node.add_property_override("Tags", self.tags)
