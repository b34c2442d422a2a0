"""The ECR repository for the trainer image."""

from __future__ import annotations

from aws_cdk import Aws, Duration, RemovalPolicy, Stack
from aws_cdk import aws_ecr as ecr
from constructs import Construct

from fsdpkit.infra.config import RegistryConfig


class Registry(Construct):
    """Private repository `<prefix>/<repository>`: immutable tags, scan on push, lifecycle expiry, kept on
    stack deletion."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: RegistryConfig, prefix: str) -> None:
        super().__init__(scope, construct_id)
        self.repository_name = f"{prefix}/{cfg.repository}"
        self.repository = ecr.Repository(
            self,
            "Repository",
            repository_name=self.repository_name,
            image_scan_on_push=True,
            # Immutable: a tag names one image for good, so cached nodes and a newly scheduled spare of one
            # job never run different code under the same tag (a re-push is refused: a new tag per build).
            image_tag_mutability=ecr.TagMutability.IMMUTABLE,
            encryption=ecr.RepositoryEncryption.KMS,  # the AWS-managed `aws/ecr` key
            # Retained so `cdk destroy` never drops images by surprise; `make teardown` deletes it.
            removal_policy=RemovalPolicy.RETAIN,
            lifecycle_rules=[
                ecr.LifecycleRule(
                    rule_priority=1,
                    description="expire untagged images after 7 days",
                    tag_status=ecr.TagStatus.UNTAGGED,
                    max_image_age=Duration.days(7),
                ),
                ecr.LifecycleRule(
                    rule_priority=2,
                    description=f"keep the newest {cfg.keep_images} images",
                    tag_status=ecr.TagStatus.ANY,
                    max_image_count=cfg.keep_images,
                ),
            ],
        )

    @property
    def repository_uri(self) -> str:
        """`<account>.dkr.ecr.<region>.<suffix>/<name>`, built from literals.

        Other stacks use it without a cross-stack reference (the repository's own URI token splits its ARN,
        which cfn-lint rejects in another stack's outputs).
        """
        stack = Stack.of(self)
        return f"{stack.account}.dkr.ecr.{stack.region}.{Aws.URL_SUFFIX}/{self.repository_name}"
