"""ECR repositories tagged by the kit, with their images (`force=True`): CloudFormation cannot delete a
non-empty repository, and a retained one keeps billing storage. Images are rebuilt by `make image`.
"""

from __future__ import annotations

from fsdpkit.ops.aws import Aws
from fsdpkit.ops.tags import PROJECT_TAG, tag_dict
from fsdpkit.ops.teardown.model import Kind, Resource, Scope


def list_repositories(aws: Aws, scope: Scope) -> list[Resource]:
    # The tagging API misses ECR (and moto's does too): list per repository.
    ecr = aws.client("ecr")
    found = []
    for page in ecr.get_paginator("describe_repositories").paginate():
        for repo in page["repositories"]:
            tags = tag_dict(ecr.list_tags_for_resource(resourceArn=repo["repositoryArn"]).get("tags"))
            if tags.get(PROJECT_TAG) != scope.prefix:
                continue
            images = ecr.list_images(repositoryName=repo["repositoryName"]).get("imageIds", [])
            found.append(
                Resource(
                    kind="ecr",
                    id=repo["repositoryName"],
                    name=repo["repositoryUri"],
                    tags=tags,
                    detail={"images": len(images)},
                )
            )
    return found


def delete_repository(aws: Aws, r: Resource, scope: Scope) -> None:
    aws.client("ecr").delete_repository(repositoryName=r.id, force=True)


KIND = Kind(name="ecr", title="ECR repositories and images", list=list_repositories, delete=delete_repository)
