"""Stragglers: how fast a slow rank is found, that noise never is, and what replacing it gives back.

`python -m bench.stragglers [--quick]` runs the rendered local Job (`python -m k8s local`, the tiny model, 2
pods x 1 rank, gloo), side by side in one run:
  2x report        rank 1 computes 2x slower from step ONSET (`slow:step=ONSET:rank=1:factor=2`), policy
                   report
  1.5x report      the same at factor 1.5
  2x replace       factor 2 with a hot spare (SPARES=1) and STRAGGLER_POLICY=replace: the slow node drains at
                   the step the ranks agree on and the spare takes its place
  fault-free load  no fault, FREE_STEPS steps, with one busy process beside the job on this 2-core machine
Figures from each run's events (training.analysis.metrics): the step a straggler was confirmed, the
stragglers a fault-free run reported, and the replace run's steps per second after the spare took over (its
median step period from the first step after the restart on) over those before the onset.
Last line: `RESULT detect_steps_2x=<confirmed - onset at 2x> detect_steps_1_5x=<same at 1.5x>
false_positives=<stragglers in the fault-free run> throughput_after_replace=<steps/s after / before>
lost_steps_replace=<steps computed again in the replace run>`. Goals: detect_steps_2x <= 10,
detect_steps_1_5x <= 30, false_positives = 0 over >= 300 fault-free steps, throughput_after_replace >= 0.9.
Full mode runs 1,000 fault-free steps and writes docs/benchmarks/stragglers.md; --quick (300) only prints.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from training.analysis.metrics import RunMetrics, load_events, load_run_metrics

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks" / "stragglers.md"
ONSET = 30
STEPS = 90
FREE_STEPS = {True: 300, False: 1000}


@dataclass(frozen=True, kw_only=True)
class Case:
    label: str
    factor: float | None
    policy: str = "report"
    spares: int = 0
    steps: int = STEPS
    load: bool = False


@dataclass(kw_only=True)
class Outcome:
    case: Case
    metrics: RunMetrics | None
    events: list[dict]
    wall_s: float
    note: str = ""


def run_case(case: Case, workdir: Path, *, timeout_s: float = 900) -> Outcome:
    run_id = "s-" + case.label.replace(" ", "-").replace(".", "-")
    fault = [f"FAULT_SPEC=slow:step={ONSET}:rank=1:factor={case.factor:g}"] if case.factor else []
    argv = [
        sys.executable, "-m", "k8s", "local", "NODES=2", f"SPARES={case.spares}", f"STEPS={case.steps}",
        "CHECKPOINT_INTERVAL=10", f"STRAGGLER_POLICY={case.policy}", f"RUN_ID={run_id}", *fault,
        "--workdir", str(workdir), "--timeout", str(timeout_s),
    ]  # fmt: skip
    env = dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if case.load else None
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s + 60)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    wall = time.monotonic() - t0
    run_dir = workdir / run_id / "volumes" / "kit-local-runs" / "runs" / run_id
    if proc.returncode != 0:
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
        return Outcome(
            case=case, metrics=None, events=[], wall_s=wall, note=f"exit {proc.returncode}: {tail}"
        )
    return Outcome(case=case, metrics=load_run_metrics(run_dir), events=load_events(run_dir), wall_s=wall)


def detect_steps(o: Outcome) -> int | None:
    """Steps from the onset to the confirmation (None: never confirmed)."""
    found = [int(e["step"]) for e in o.events if e["kind"] == "straggler"]
    return min(found) - ONSET if found else None


def throughput_after_replace(o: Outcome) -> float | None:
    """Rank 0's median step period before the onset over its median after the spare took over."""
    steps = [e for e in o.events if e["kind"] == "step" and e.get("role") == "trainer" and e.get("rank") == 0]
    first = [e for e in steps if int(e.get("attempt") or 0) == 0]
    later = [e for e in steps if int(e.get("attempt") or 0) > 0]

    def period(events: list[dict]) -> float | None:
        starts = sorted(float(e["t_start"]) for e in events)
        gaps = [b - a for a, b in itertools.pairwise(starts)][2:]  # the first two: warm-up
        return statistics.median(gaps) if gaps else None

    before = period([e for e in first if int(e["step"]) < ONSET])
    after = period(later)
    return before / after if before and after else None


def _fmt(value: float | int | None, spec: str = ".2f") -> str:
    return "nan" if value is None else f"{value:{spec}}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stragglers", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="300 fault-free steps; no doc")
    args = parser.parse_args(argv)
    cases = [
        Case(label="2x report", factor=2.0),
        Case(label="1.5x report", factor=1.5),
        Case(label="2x replace", factor=2.0, policy="replace", spares=1),
        Case(label="fault-free load", factor=None, steps=FREE_STEPS[args.quick], load=True),
    ]
    started = time.monotonic()
    outcomes: dict[str, Outcome] = {}
    with tempfile.TemporaryDirectory(prefix="kit-bench-stragglers-") as tmp:
        for case in cases:
            o = run_case(case, Path(tmp))
            outcomes[case.label] = o
            m = o.metrics
            print(
                f"{case.label:16} wall {o.wall_s:.1f} s, steps {m.steps_completed if m else '-'}, stragglers "
                f"{len(m.stragglers) if m else '-'}, confirmed after {_fmt(detect_steps(o), 'd')} steps"
                + (f"  [{o.note}]" if o.note else ""),
                flush=True,
            )
    replace = outcomes["2x replace"]
    free = outcomes["fault-free load"]
    figures = {
        "detect_steps_2x": _fmt(detect_steps(outcomes["2x report"]), "d"),
        "detect_steps_1_5x": _fmt(detect_steps(outcomes["1.5x report"]), "d"),
        "false_positives": _fmt(len(free.metrics.stragglers) if free.metrics else None, "d"),
        "throughput_after_replace": _fmt(throughput_after_replace(replace)),
        "lost_steps_replace": _fmt(replace.metrics.lost_steps if replace.metrics else None, "d"),
    }
    result = "RESULT " + " ".join(f"{k}={v}" for k, v in figures.items())
    if not args.quick:
        lines = [
            "## Stragglers: detection, false alarms, replacement (`bench/stragglers.py`)",
            "",
            f"Command: `python -m bench.stragglers` ({(time.monotonic() - started) / 60:.1f} min here).",
            "Tiny model, 2 pods x 1 rank through the local Job; rank 1 slow from step "
            f"{ONSET}; the fault-free run {FREE_STEPS[False]} steps beside a busy process.",
            "",
            "| case | steps | stragglers | confirmed after (steps) | lost steps | wall |",
            "|---|---|---|---|---|---|",
        ]
        for label, o in outcomes.items():
            m = o.metrics
            lines.append(
                f"| {label} | {m.steps_completed if m else '-'} | {len(m.stragglers) if m else '-'} | "
                f"{_fmt(detect_steps(o), 'd')} | {m.lost_steps if m else '-'} | {o.wall_s:.0f} s |"
            )
        lines += ["", "```", result, "```", ""]
        DOC.write_text("\n".join(lines), encoding="utf-8")
        print(f"wrote {DOC.relative_to(REPO)}")
    print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
