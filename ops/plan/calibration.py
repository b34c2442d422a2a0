"""The plan's measured inputs: the file the kit's benchmarks write, and what the plan reads from it.

`ops/plan/calibration.json` holds one section per benchmark that measures a phase the model uses,
each with when and how it was measured:
  goodput_phases   `python -m bench.goodput --calibrate`: per mechanism on the CPU job (tiny model, 2 ranks,
                   gloo), the run's fixed overhead (launch to first step and the exit), one save's cost to
                   the loop, and one fault's cost per fault kind, from single-fault and fault-free runs
                   (ops/plan/schedule.py says how); bench.goodput's validation predicts its schedule from it
  scale            `python -m bench.scale`: the kit's rendezvous per node count: detection of a silent node
                   and re-forming around a spare; the plan fits log(figure) on log(N) and projects along it
A benchmark rewrites only its own section. A missing file or section is not an error: the plan then uses
its typed defaults and says which figures are not measured.
"""

from __future__ import annotations

import json
import math
import os
import platform
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsdpkit.ops.plan.model import PhaseTimes

REPO = Path(__file__).resolve().parents[2]
CALIBRATION_FILE = Path(__file__).with_name("calibration.json")


class CalibrationError(ValueError):
    """The calibration file exists but cannot be used; one line that says which and what to do."""


def write_section(name: str, data: Mapping[str, Any], *, command: str, path: Path = CALIBRATION_FILE) -> Path:
    """Replace section `name` (atomically: a reader never sees half a file), keeping the others."""
    sections = read_sections(path) if path.exists() else {}
    sections[name] = {
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": command,
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}",
        **data,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(json.dumps(sections, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def read_sections(path: Path = CALIBRATION_FILE) -> dict[str, Any]:
    """Every section of the file ({} when there is none)."""
    if not path.exists():
        return {}
    try:
        sections = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CalibrationError(
            f"{path}: not readable JSON ({exc}); rerun the benchmark that writes it"
        ) from exc
    if not isinstance(sections, dict):
        raise CalibrationError(f"{path}: expected a JSON object of sections; rerun the benchmarks")
    return sections


def _finite(section: str, key: str, value: Any) -> float:
    if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise CalibrationError(
            f"calibration {section}.{key}={value!r}: not a finite number >= 0; rerun the benchmark"
        )
    return float(value)


@dataclass(frozen=True, kw_only=True)
class MechanismPhases:
    """One mechanism's costs on the CPU job (seconds at `step_s` a step), from bench.goodput --calibrate."""

    step_s: float
    """The calibration runs' median fault-free step."""
    overhead_s: float
    """Launch to the first step, plus the exit: paid once per run."""
    save_s: float
    """One save's cost to the loop: the stall and the slower steps beside a background write."""
    fault_s: dict[str, float]
    """One fault of each kind: detection, restart, re-forming, restore, the first slow steps (not the replay,
    which the model counts from the schedule)."""
    keeps_live_state: bool
    """True when the mechanism recovers these faults in process from the state in memory (no replay)."""


@dataclass(frozen=True, kw_only=True)
class GoodputPhases:
    measured: str
    command: str
    collective_timeout_s: float
    """torchrun's collective timeout in the calibration runs: a hang's detection under it."""
    mechanisms: dict[str, MechanismPhases]


@dataclass(frozen=True, kw_only=True)
class ScalePoint:
    nodes: int
    detect_s: float
    reform_s: float


@dataclass(frozen=True, kw_only=True)
class ScalePhases:
    """The rendezvous' detection and re-forming per node count (bench.scale), and their fits."""

    measured: str
    command: str
    points: tuple[ScalePoint, ...]

    @property
    def largest(self) -> int:
        return max(p.nodes for p in self.points)

    def at(self, key: str, nodes: int) -> float:
        """The figure at `nodes`: the measurement there, else the largest N's along the fitted exponent."""
        for p in self.points:
            if p.nodes == nodes:
                return float(getattr(p, key))
        rows = [{"nodes": p.nodes, key: getattr(p, key)} for p in self.points]
        return project(rows, key, nodes)


def growth(rows: Sequence[Mapping[str, float]], key: str) -> float:
    """The exponent b of figure ~ a * N^b, least squares on log-log (figures <= 0 left out)."""
    points = [(math.log(r["nodes"]), math.log(r[key])) for r in rows if r[key] > 0]
    if len(points) < 2:
        return float("nan")
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else float("nan")


def project(rows: Sequence[Mapping[str, float]], key: str, nodes: int) -> float:
    """The fitted figure at `nodes`, from the largest measured N along the fitted exponent."""
    last = max(rows, key=lambda r: r["nodes"])
    return last[key] * (nodes / last["nodes"]) ** growth(rows, key)


def goodput_phases(sections: Mapping[str, Any]) -> GoodputPhases | None:
    raw = sections.get("goodput_phases")
    if raw is None:
        return None
    try:
        mechanisms = {
            name: MechanismPhases(
                step_s=_finite("goodput_phases", f"{name}.step_s", m["step_s"]),
                overhead_s=_finite("goodput_phases", f"{name}.overhead_s", m["overhead_s"]),
                save_s=_finite("goodput_phases", f"{name}.save_s", m["save_s"]),
                fault_s={
                    kind: _finite("goodput_phases", f"{name}.fault_s.{kind}", v)
                    for kind, v in m["fault_s"].items()
                },
                keeps_live_state=bool(m["keeps_live_state"]),
            )
            for name, m in raw["mechanisms"].items()
        }
        return GoodputPhases(
            measured=str(raw["measured"]),
            command=str(raw["command"]),
            collective_timeout_s=_finite(
                "goodput_phases", "collective_timeout_s", raw["collective_timeout_s"]
            ),
            mechanisms=mechanisms,
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise CalibrationError(
            f"calibration goodput_phases: missing or malformed {exc}; "
            "rerun python -m bench.goodput --calibrate"
        ) from exc


def scale_phases(sections: Mapping[str, Any]) -> ScalePhases | None:
    raw = sections.get("scale")
    if raw is None:
        return None
    try:
        points = tuple(
            ScalePoint(
                nodes=int(r["nodes"]),
                detect_s=_finite("scale", "detect_s", r["detect_s"]),
                reform_s=_finite("scale", "reform_s", r["reform_s"]),
            )
            for r in raw["rows"]
        )
        if len({p.nodes for p in points}) < 2:
            raise CalibrationError("calibration scale: fewer than 2 node counts; rerun python -m bench.scale")
        return ScalePhases(measured=str(raw["measured"]), command=str(raw["command"]), points=points)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, CalibrationError):
            raise
        raise CalibrationError(
            f"calibration scale: missing or malformed {exc}; rerun python -m bench.scale"
        ) from exc


STUDY_P5 = "p5 projection: the study's figure (AWS + NVIDIA, reference/seed-system.md)"


def _scale_source(scale: ScalePhases, key: str, nodes: int) -> str:
    if any(p.nodes == nodes for p in scale.points):
        return f"measured: {scale.command} ({scale.measured}), N={nodes}"
    rows = [{"nodes": p.nodes, key: getattr(p, key)} for p in scale.points]
    return (
        f"projected: {scale.command} ({scale.measured}) at N={scale.largest}, "
        f"along its fit N^{growth(rows, key):.2f}"
    )


def phase_times(
    nodes: int, scale: ScalePhases | None, *, replacement_s: float
) -> tuple[PhaseTimes, dict[str, str]]:
    """The model's phase times for a job of `nodes`, and where each comes from: the kit's control plane
    from bench.scale's measurements (projected along their fits beyond the largest N measured), the restarts
    that need GPUs from the study's p5 figures (a CPU restart re-creates no NCCL communicator)."""
    defaults = PhaseTimes()
    sources = {
        "inprocess_restart_s": STUDY_P5,
        "ft_launcher_restart_s": STUDY_P5,
        "kubernetes_restart_s": STUDY_P5,
        "node_detect_s": "default: the launcher's keep-alive 0.25 s x 5 (bench.scale not calibrated)",
        "reform_s": "default (bench.scale not calibrated)",
        "first_step_factor": "assumed: one step",
        "replacement_s": "--replacement-s: EKS node repair, scheduling and image pull (assumed)",
    }
    detect, reform = defaults.node_detect_s, defaults.reform_s
    if scale is not None:
        detect, reform = scale.at("detect_s", nodes), scale.at("reform_s", nodes)
        sources["node_detect_s"] = _scale_source(scale, "detect_s", nodes)
        sources["reform_s"] = _scale_source(scale, "reform_s", nodes)
    phases = PhaseTimes(node_detect_s=detect, reform_s=reform, replacement_s=replacement_s)
    return phases, sources
