"""What faults and checkpoint stalls cost, from a run's metrics (`python -m fsdpkit.analysis.report --json`).

GPU-hours = GPUs x seconds / 3600, with one GPU per trainer rank (world_size). Buckets, from RunMetrics:
  stall     checkpoint stalls (stall_s) plus the final drain (drain_s)
  recovery  fault -> end of the first step after the resume (recovery_s, summed over faults)
  rework    steps computed again, beyond the first one after each resume (that one is inside recovery)
  useful    steps_completed x median fault-free step time
  spares    hot spare nodes x GPUs per node (world_size / training nodes) x wall time: a spare's node is
            paid for the whole run whether or not it takes over (the Job's replacement pod becomes the next
            spare, so the count stays S). What they save (the slow Kubernetes path avoided) is not in one
            run's events: the report gives the cost and which faults a spare took over, not a saving.
total = the training GPUs x wall time, plus spares; a run that changed its world size (elastic) pays each
stretch at its own size (`by_world`: GPU-hours at each world size, from RunMetrics.world_spans).
Cost per 1,000 steps = total GPU-hours x price /
steps_completed x 1000; cost of one fault = its recovery plus its rework, and their mean over the faults.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fsdpkit.contracts.run_layout import EVENTS_DIR
from fsdpkit.ops.aws import OpsError

REPORT_TIMEOUT_S = 600.0
"""A run's metrics take seconds to compute even for a long run; more means something hangs."""


@dataclass(frozen=True, kw_only=True)
class FaultCostItem:
    kind: str
    step: int | None
    gpu_hours: float
    usd: float
    takeover: str | None = None
    """Who trained in a lost node's place: spare, replacement, same nodes (None for rank-level faults)."""


@dataclass(frozen=True, kw_only=True)
class FaultCost:
    gpus: int
    usd_per_gpu_hour: float
    price_source: str
    wall_h: float
    steps_completed: int
    spare_nodes: int = 0
    """Hot spare nodes the run kept beside its training nodes."""
    gpus_per_node: int = 0
    """GPUs of one node (world_size / training nodes); 0 when the run has no kit launcher events."""
    gpu_hours: dict[str, float]
    """total, useful, stall, recovery, rework, spares (GPU-hours)."""
    usd: dict[str, float]
    usd_per_1000_steps: float | None
    per_fault: list[FaultCostItem] = field(default_factory=list)
    by_world: dict[int, float] = field(default_factory=dict)
    """GPU-hours at each world size the run trained at (one entry unless it shrank or grew)."""

    @property
    def usd_per_fault(self) -> float | None:
        return sum(f.usd for f in self.per_fault) / len(self.per_fault) if self.per_fault else None


def load_metrics(run_dir: Path, *, python: str = sys.executable) -> Any:
    """The run's metrics as `python -m fsdpkit.analysis.report RUN_DIR --json` prints them (the one module
    that defines them; ops reads its JSON as data and imports nothing of the trainer), as attributes."""
    if not run_dir.is_dir():
        raise OpsError(f"--run-dir {str(run_dir)!r} is not a folder; pass <run.root>/<run.id>")
    if not (run_dir / EVENTS_DIR).is_dir():
        raise OpsError(f"--run-dir {str(run_dir)!r} has no events/ folder; pass a run folder (contract 3)")
    command = [python, "-m", "fsdpkit.analysis.report", str(run_dir), "--json", "--no-png"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=REPORT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OpsError(f"cannot run {' '.join(command[1:4])} ({exc}); run from the repository root") from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise OpsError(f"cannot compute metrics from {run_dir}: {why.removeprefix('error: ')}")
    try:
        return json.loads(done.stdout, object_hook=lambda fields: SimpleNamespace(**fields))
    except json.JSONDecodeError as exc:
        raise OpsError(
            f"the metrics of {run_dir} are not JSON ({exc.msg}): rerun with the same checkout"
        ) from None


def fault_cost(m: Any, usd_per_gpu_hour: float, price_source: str) -> FaultCost:
    gpus = int(m.world_size)
    h = 3600.0
    per_fault = []
    rework_s_total = 0.0
    for f in m.faults:
        lost = f.lost_steps if f.lost_steps is not None else 0
        rework_s = max(lost - 1, 0) * m.median_step_s if f.recovery_s is not None else lost * m.median_step_s
        rework_s_total += rework_s
        gh = gpus * ((f.recovery_s or 0.0) + rework_s) / h
        item = FaultCostItem(
            kind=f.kind, step=f.step, gpu_hours=gh, usd=gh * usd_per_gpu_hour, takeover=f.takeover
        )
        per_fault.append(item)
    if not m.faults and m.lost_steps:
        rework_s_total = m.lost_steps * m.median_step_s
    spares = int(m.spare_nodes)
    per_node = gpus // m.training_nodes if m.training_nodes else 0
    spare_gh = spares * per_node * m.wall_s / h
    by_world: dict[int, float] = {}
    for span in getattr(m, "world_spans", None) or []:
        by_world[span.world_size] = by_world.get(span.world_size, 0.0) + span.world_size * span.duration_s / h
    training_gh = sum(by_world.values()) if len(by_world) > 1 else gpus * m.wall_s / h
    gpu_hours = {
        "total": training_gh + spare_gh,
        "useful": gpus * m.steps_completed * m.median_step_s / h,
        "stall": gpus * (m.stall_s + m.drain_s) / h,
        "recovery": gpus * m.recovery_s_total / h,
        "rework": gpus * rework_s_total / h,
        "spares": spare_gh,
    }
    usd = {k: v * usd_per_gpu_hour for k, v in gpu_hours.items()}
    per_1000 = usd["total"] / m.steps_completed * 1000 if m.steps_completed else None
    return FaultCost(
        gpus=gpus,
        usd_per_gpu_hour=usd_per_gpu_hour,
        price_source=price_source,
        wall_h=m.wall_s / h,
        spare_nodes=spares,
        gpus_per_node=per_node,
        steps_completed=m.steps_completed,
        gpu_hours=gpu_hours,
        usd=usd,
        usd_per_1000_steps=per_1000,
        per_fault=per_fault,
        by_world=dict(sorted(by_world.items(), reverse=True)) if len(by_world) > 1 else {},
    )
