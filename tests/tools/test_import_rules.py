"""The house's import rules (tools/import_rules.py) hold for the repository, and each rule, broken once on
purpose in a small tree of its own, is caught with the file, the line and the rule's name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools.import_rules import check

REPO = Path(__file__).resolve().parents[2]

ALLOWED = {
    "training/contracts/env.py": "import os\nNAME = 'X'\n",
    "training/runtime/events.py": "from fsdpkit.contracts import env\n",
    "training/resilience/__init__.py": "from fsdpkit.resilience.job import Job\n",
    "training/resilience/job.py": "import torch\nfrom fsdpkit.runtime import events\n",
    "training/launcher/agent.py": "from fsdpkit.runtime.events import env\n",
    "training/trainer/train.py": "from fsdpkit import resilience\nfrom fsdpkit.contracts import env\n",
    "training/analysis/metrics.py": "from fsdpkit.runtime import events\n",
    "k8s/spec.py": "from fsdpkit.contracts import env\nfrom fsdpkit.ops.plan import planner\n",
    "ops/plan/planner.py": "from fsdpkit.infra.config import load\nfrom fsdpkit.contracts.env import NAME\n",
    "infra/config.py": "from fsdpkit.contracts import env\n\ndef load(): ...\n",
    "examples/train.py": "from fsdpkit import resilience\n",
}
"""A tree that keeps every rule: the floors importing downward, the parts meeting at their allowed edges."""


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        for parent in path.relative_to(root).parents:
            init = root / parent / "__init__.py"
            if parent != Path(".") and not init.exists():
                init.write_text("", encoding="utf-8")
    return root


def test_the_repository_keeps_every_import_rule() -> None:
    broken = check(REPO)
    assert not broken, "\n".join(map(str, broken))


def test_a_tree_that_keeps_the_rules_passes(tmp_path: Path) -> None:
    assert check(_tree(tmp_path, ALLOWED)) == []


BREAKS = [
    pytest.param(
        {
            "training/runtime/pod.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from fsdpkit.runtime import events\n",
            "training/runtime/events.py": "from fsdpkit.runtime import pod\n",
        },
        "circles",
        "training/runtime/events.py:1",
        "import circle among fsdpkit.runtime.events, fsdpkit.runtime.pod",
        id="a circle closed by a type-only import",
    ),
    pytest.param(
        {"training/runtime/distributed.py": "def f():\n    from fsdpkit.resilience import job\n"},
        "floors",
        "training/runtime/distributed.py:2",
        "a floor above it",
        id="an upward import",
    ),
    pytest.param(
        {"training/resilience/job.py": "from fsdpkit.launcher import agent\n"},
        "floors",
        "training/resilience/job.py:1",
        "share a floor and stay apart",
        id="a sibling floor",
    ),
    pytest.param(
        {"infra/config.py": "from fsdpkit.runtime import events\n\ndef load(): ...\n"},
        "parts",
        "infra/config.py:1",
        "infra meets other parts only at fsdpkit.contracts",
        id="infra importing training beyond the contracts",
    ),
    pytest.param(
        {"ops/cost.py": "import importlib\nm = importlib.import_module('fsdpkit.analysis.metrics')\n"},
        "parts",
        "ops/cost.py:2",
        "fsdpkit.ops.cost imports fsdpkit.analysis.metrics",
        id="ops importing training by a literal import_module",
    ),
    pytest.param(
        {"infra/stack.py": "from fsdpkit.k8s import spec\n"},
        "parts",
        "infra/stack.py:1",
        "fsdpkit.infra.stack imports fsdpkit.k8s.spec",
        id="a part edge nobody allowed",
    ),
    pytest.param(
        {"training/runtime/aws.py": "import boto3\n"},
        "libraries",
        "training/runtime/aws.py:1",
        "boto3, which fsdpkit.runtime never imports",
        id="training and boto3",
    ),
    pytest.param(
        {"training/launcher/stack.py": "from aws_cdk import Stack\n"},
        "libraries",
        "training/launcher/stack.py:1",
        "aws_cdk, which fsdpkit.launcher never imports",
        id="training and CDK",
    ),
    pytest.param(
        {"training/contracts/shapes.py": "import torch\n"},
        "libraries",
        "training/contracts/shapes.py:1",
        "fsdpkit.contracts uses the standard library only",
        id="the contracts and torch",
    ),
    pytest.param(
        {"training/resilience/state.py": "from transformers import AutoModel\n"},
        "libraries",
        "training/resilience/state.py:1",
        "transformers, which fsdpkit.resilience never imports",
        id="the API and a model library",
    ),
    pytest.param(
        {"k8s/render.py": "import torch\n"},
        "libraries",
        "k8s/render.py:1",
        "torch, which fsdpkit.k8s never imports",
        id="k8s and torch",
    ),
    pytest.param(
        {
            "training/trainer/config.py": "from fsdpkit.resilience.config import RunConfig\n",
            "training/resilience/config.py": "class RunConfig: ...\n",
        },
        "public-api",
        "training/trainer/config.py:1",
        "imports fsdpkit.resilience.config",
        id="the kit trainer through a private module",
    ),
    pytest.param(
        {"examples/train.py": "from fsdpkit.runtime.events import EventLog\n"},
        "public-api",
        "examples/train.py:1",
        "a user of the API imports `fsdpkit.resilience`",
        id="an example beside the API",
    ),
]


BREAKS += [
    pytest.param(
        {"k8s/spec.py": "from fsdpkit.contracts import env\nfrom training.contracts import seeds\n"},
        "one-name",
        "k8s/spec.py:2",
        "fsdpkit.k8s.spec imports training.contracts.seeds: import the kit as fsdpkit",
        id="the kit by its folder's name",
    ),
    pytest.param(
        {"tests/test_x.py": "from k8s.model import JobValues\n"},
        "one-name",
        "tests/test_x.py:1",
        "tests.test_x imports k8s.model.JobValues",
        id="a test by the folder's name",
    ),
]


@pytest.mark.parametrize(("files", "rule", "where", "says"), BREAKS)
def test_each_rule_broken_once_is_caught(
    tmp_path: Path, files: dict[str, str], rule: str, where: str, says: str
) -> None:
    broken = check(_tree(tmp_path, {**ALLOWED, **files}))
    assert len(broken) == 1, "\n".join(map(str, broken))
    (violation,) = broken
    assert (violation.rule, f"{violation.path}:{violation.line}") == (rule, where)
    assert says in violation.message


def test_the_command_prints_one_line_per_break_and_fails(tmp_path: Path) -> None:
    root = _tree(tmp_path, {**ALLOWED, "k8s/render.py": "import torch\n"})
    command = [sys.executable, "-m", "tools.import_rules", str(root)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "k8s/render.py:1: libraries: fsdpkit.k8s.render imports torch, which fsdpkit.k8s never imports"
    ]
