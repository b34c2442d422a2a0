"""Kit-tagged S3 buckets: data, so kept unless `--delete-data`. Emptied fully (versions, delete markers,
multipart uploads) in batches of at most 1,000 keys (S3's limit; moto would accept more), then deleted.
"""

from __future__ import annotations

import botocore.exceptions

from fsdpkit.ops.aws import Aws, error_code
from fsdpkit.ops.teardown.kinds.tagging import tagged
from fsdpkit.ops.teardown.model import DeleteFailed, Kind, Resource, Scope

MAX_DELETE_BATCH = 1000


LEGACY_LOCATIONS = {None: "us-east-1", "": "us-east-1", "EU": "eu-west-1"}
"""What GetBucketLocation says for the oldest regions."""


def bucket_region(aws: Aws, bucket: str) -> str | None:
    """The bucket's own region (None when it is gone): the tagging API lists buckets of every region."""
    try:
        where = aws.client("s3").get_bucket_location(Bucket=bucket).get("LocationConstraint")
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) in ("NoSuchBucket", "404"):
            return None
        raise
    return LEGACY_LOCATIONS.get(where, where)


def list_buckets(aws: Aws, scope: Scope) -> list[Resource]:
    found = []
    for t in tagged(aws, scope, ("s3:bucket",)):
        if bucket_region(aws, t.id) != scope.region:
            continue  # another region's bucket: that region's teardown plans it
        found.append(Resource(kind="s3", id=t.id, name=t.id, tags=t.tags, detail={"is_data": True}))
    return found


def batches(keys: list[dict], size: int = MAX_DELETE_BATCH) -> list[list[dict]]:
    if not 1 <= size <= MAX_DELETE_BATCH:
        raise ValueError(f"S3 delete batch must be 1..{MAX_DELETE_BATCH} keys, got {size}")
    return [keys[i : i + size] for i in range(0, len(keys), size)]


def empty_bucket(aws: Aws, bucket: str) -> int:
    """Delete every version, delete marker and unfinished upload; returns the number of keys deleted."""
    s3 = aws.client("s3")
    for page in s3.get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
        for up in page.get("Uploads", []):
            s3.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
    deleted = 0
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
        keys = [
            {"Key": v["Key"], "VersionId": v["VersionId"]}
            for v in page.get("Versions", []) + page.get("DeleteMarkers", [])
        ]
        for batch in batches(keys):
            out = s3.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
            if out.get("Errors"):
                e = out["Errors"][0]
                raise DeleteFailed(f"could not delete s3://{bucket}/{e['Key']}: {e['Code']} {e['Message']}")
            deleted += len(batch)
    return deleted


def delete_bucket(aws: Aws, r: Resource, scope: Scope) -> None:
    empty_bucket(aws, r.id)
    aws.client("s3").delete_bucket(Bucket=r.id)


KIND = Kind(name="s3", title="S3 buckets (only with --delete-data)", list=list_buckets, delete=delete_bucket)
