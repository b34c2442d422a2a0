"""The run folder (design, contract 3): one per run id on shared storage, never shared between runs.

    <run.root>/<run.id>/
      checkpoints/step_<N:08d>/   the shards of step N, and commit.json written last (no commit, no step)
      events/*.jsonl              one file per process: every metric is computed from these lines
      metrics/*.jsonl             live metric records (KIT_METRICS=file), the dashboard preview's input

The trainer, the launcher and the report write and read it; ops reads a run's metrics through the report.
"""

from __future__ import annotations

import re

CHECKPOINTS_DIR = "checkpoints"
COMMIT_FILE = "commit.json"
"""A step's commit record: its presence is what makes the step exist for resume."""
EVENTS_DIR = "events"
METRICS_DIR = "metrics"
STEP_DIR = re.compile(r"^step_(\d{8,})$")
"""A step folder's name; the step is the number."""


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"
