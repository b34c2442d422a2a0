"""Shared inputs of the k8s tests: a stack outputs file as `cdk deploy --outputs-file` writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

STACK_OUTPUTS = {
    "Kit-Cluster": {
        "ClusterName": "kit-cluster",
        "Region": "us-east-2",
        "GpuNodeLabels": json.dumps({"role": "gpu-train", "vpc.amazonaws.com/efa.present": "true"}),
        "GpuNodeTaint": "nvidia.com/gpu=true:NoSchedule",
        "GpuInstanceType": "p5.48xlarge",
        "GpuNodeCount": "4",
        "GpusPerNode": "8",
        "EfaDevicesPerNode": "32",
        "EcrRepositoryUri": "123456789012.dkr.ecr.us-east-2.amazonaws.com/kit-trainer",
        "ClusterSecurityGroupId": "sg-0123",  # unknown keys are tolerated
    },
    "Kit-Storage": {
        "FsxFileSystemId": "fs-0123456789abcdef0",
        "FsxDnsName": "fs-0123456789abcdef0.fsx.us-east-2.amazonaws.com",
        "FsxMountName": "abcdefgh",
        "FsxStorageGiB": "2400",
    },
}


@pytest.fixture
def stack_outputs() -> dict:
    return json.loads(json.dumps(STACK_OUTPUTS))


@pytest.fixture
def outputs_file(tmp_path: Path, stack_outputs: dict) -> Path:
    path = tmp_path / "cdk-outputs.json"
    path.write_text(json.dumps(stack_outputs), encoding="utf-8")
    return path
