"""Snapshots of every stack of the default kit; only asset hashes and construct-address labels are masked.

Accept an intended change with `pytest tests/infra --snapshot-update` and review the diff.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from syrupy.assertion import SnapshotAssertion
from syrupy.extensions.json import JSONSnapshotExtension

from tests.infra.conftest import Synth

ASSET_KEY = re.compile(r"\b[0-9a-f]{64}\.(zip|json)\b")
"""Lambda/layer asset object keys: they change with aws-cdk-lib and layer versions, not with the kit."""
PRUNE_LABEL = re.compile(r"aws\.cdk\.eks/prune-[0-9a-f]+")
"""kubectl prune label derived from the construct address."""


def masked(template: dict[str, Any]) -> dict[str, Any]:
    text = json.dumps(template, sort_keys=True)
    text = ASSET_KEY.sub(r"<asset-hash>.\1", text)
    text = PRUNE_LABEL.sub("aws.cdk.eks/prune-<address>", text)
    return json.loads(text)


@pytest.fixture
def snapshot_json(snapshot: SnapshotAssertion) -> SnapshotAssertion:
    return snapshot.use_extension(JSONSnapshotExtension)


@pytest.mark.parametrize("stack", ["network", "storage", "registry", "cluster"])
def test_stack_snapshot(synth: Synth, stack: str, snapshot_json: SnapshotAssertion) -> None:
    assert masked(synth.template("default", stack)) == snapshot_json


def test_masking_touches_only_hashes() -> None:
    template = {"S3Key": "a" * 64 + ".zip", "Label": "aws.cdk.eks/prune-c8f1", "Name": "b" * 64}
    assert masked(template) == {
        "S3Key": "<asset-hash>.zip",
        "Label": "aws.cdk.eks/prune-<address>",
        "Name": "b" * 64,
    }
