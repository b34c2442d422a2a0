"""The real `cdk synth` CLI offline, no credentials: bad values fail cleanly, defaults synth quietly."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.infra.conftest import REPO

CDK = REPO / "node_modules" / ".bin" / "cdk"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CDK.exists(), reason="the CDK CLI is installed by `make setup` (npm ci)"),
]


def run_cdk(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`cdk synth -q` from the repo root with no credentials, writing into tmp_path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        PATH=f"{REPO / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        AWS_CONFIG_FILE=str(tmp_path / "no-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-credentials"),
        AWS_EC2_METADATA_DISABLED="true",
        JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION="1",
        JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION="1",
    )
    return subprocess.run(
        [str(CDK), "synth", "-q", "-o", str(tmp_path / "cdk.out"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_bad_value_exits_non_zero_with_one_error_line_and_no_traceback(tmp_path: Path) -> None:
    result = run_cdk(tmp_path, "-c", "gpu.max_nodes=0")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Traceback" not in output
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: gpu.max_nodes: 0 is not allowed; use 1 .. 450 "
        "(the most nodes one EKS managed node group holds)"
    ]
    assert not (tmp_path / "cdk.out" / "manifest.json").exists()


def test_defaults_synthesize_offline_without_credentials_or_warnings(tmp_path: Path) -> None:
    result = run_cdk(tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    alarming = [
        line
        for line in output.splitlines()
        if any(word in line.lower() for word in ("warn", "error", "deprecat", "credentials", "!!"))
    ]
    assert alarming == []
    capacity = [line for line in output.splitlines() if line.startswith("gpu: ")]
    assert capacity == [
        "gpu: 0 x p5.48xlarge (default; max 2, on demand, no reservation); cluster, FSx and ECR deploy "
        "either way; start nodes with -c gpu.desired_nodes=N"
    ]
    outdir = tmp_path / "cdk.out"
    manifest = json.loads((outdir / "manifest.json").read_text(encoding="utf-8"))
    assert "missing" not in manifest
    names = sorted(p.name for p in outdir.glob("*.template.json"))
    assert names == [f"fsdp-kit-{s}.template.json" for s in ("cluster", "network", "registry", "storage")]
