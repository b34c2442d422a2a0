"""A stack that carries the kit's tags (contract 1) on itself and on every taggable resource."""

from __future__ import annotations

from aws_cdk import Environment, Stack, Tags
from constructs import Construct

from infra.config import KitConfig
from infra.tags import PROJECT_TAG, STACK_TAG


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
