"""`make bench`: run every benchmark in bench/ and rewrite docs/benchmarks.md from the parts' sections.

A benchmark is any `bench/<name>.py` with a `__main__` block (this file excepted). Each runs as
`python -m bench.<name>` (with `--quick` in quick mode), its output streamed with a prefix; its last
`RESULT ...` line is kept. Each part writes its own tables, with the command that made them, to
`docs/benchmarks/<part>.md`; this tool merges those sections under the machine's description and beside the
anchors' published figures, which are marked as theirs (not measured here).

Full mode rewrites docs/benchmarks.md; quick mode writes build/benchmarks-quick.md (so quick figures never
replace the recorded ones). `--merge-only` rebuilds the document from the sections without running anything.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
SECTIONS = REPO / "docs" / "benchmarks"
OUTPUT = REPO / "docs" / "benchmarks.md"
QUICK_OUTPUT = REPO / "build" / "benchmarks-quick.md"
SKIP = {"__init__", "run_all", "__main__"}
MAIN_RE = re.compile(r"^if __name__ == [\"']__main__[\"']:", re.MULTILINE)


@dataclass(frozen=True, kw_only=True)
class BenchRun:
    name: str
    command: str
    returncode: int
    wall_s: float
    result: str | None
    """The benchmark's last `RESULT ...` line, if it printed one."""


def discover(bench_dir: Path = BENCH) -> list[str]:
    """Benchmark module names in bench/ (sorted): files with a `__main__` block."""
    names = []
    for path in sorted(bench_dir.glob("*.py")):
        if path.stem in SKIP or path.stem.startswith("_"):
            continue
        if MAIN_RE.search(path.read_text(encoding="utf-8")):
            names.append(path.stem)
    return names


def run_one(name: str, *, quick: bool, timeout_s: float) -> BenchRun:
    """Run `python -m bench.<name>`, streaming its output; keep the last RESULT line."""
    argv = [sys.executable, "-m", f"bench.{name}", *(["--quick"] if quick else [])]
    shown = " ".join(["python", *argv[1:]])
    print(f"== {shown}", flush=True)
    result: str | None = None
    t0 = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as proc:
        watchdog = threading.Timer(timeout_s, proc.kill)  # a silent, stuck benchmark is stopped too
        watchdog.start()
        try:
            for line in proc.stdout or ():
                print(f"[{name}] {line}", end="", flush=True)
                if line.startswith("RESULT "):
                    result = line.strip()
            rc = proc.wait()
        finally:
            watchdog.cancel()
    if time.monotonic() - t0 >= timeout_s:
        print(f"[{name}] stopped after {timeout_s:.0f} s (--timeout)", flush=True)
    return BenchRun(name=name, command=shown, returncode=rc, wall_s=time.monotonic() - t0, result=result)


def machine_info() -> list[tuple[str, str]]:
    """What the figures were measured on: CPU model, cores, memory, Python, torch, OS."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        kib = int(Path("/proc/meminfo").read_text(encoding="utf-8").split()[1])
        mem = f"{kib / 2**20:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    try:
        import torch

        torch_v = torch.__version__
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    except ImportError:
        torch_v, gpu = "not installed", "?"
    return [
        ("CPU", cpu),
        ("cores", str(os.cpu_count())),
        ("memory", mem),
        ("GPU", gpu),
        ("OS", f"{platform.system()} {platform.release()}"),
        ("Python", platform.python_version()),
        ("torch", torch_v),
    ]


# The anchors' published figures, reference/seed-system.md §12 and reference/torch-on-cpu.md §0.
# Theirs, not measured here: shown so a reader can place our numbers, never used as test oracles.
ANCHORS = """\
## Published figures (theirs, not measured here)

These are the anchors' own reported numbers, copied for reference. They ran on other hardware (the study: 2-8
p5.48xlarge nodes, Llama-3.1-8B, FSx for Lustre SCRATCH_2 1.2 TB), so compare ratios, not absolute values.

**AWS blog "Fault tolerant distributed training on Amazon EKS using NVRx" (Sep 2026): checkpointing.**

| Setting (theirs) | Async efficiency | Sync efficiency |
|---|---|---|
| every 1,000 steps, 2 -> 8 nodes | 99.2 % -> 99.8 % | 57-61 % |
| every 1,000 steps, 8 nodes | 99.8 % | 60.3 % |
| every 100 steps, 8 nodes | 29.6 % | 14.7 % |

**Same blog: fault recovery, 2 nodes (16 H100), checkpoint every 500 of 2,000 steps, 5 faults.**

| Mechanism (theirs) | Training goodput | Infra goodput | Recovery time | Container restarts |
|---|---|---|---|---|
| NVRx in-process restart | 31 % | 87 % | ~10 s | 0 |
| NVRx ft_launcher | 25.5 % | 85.9 % | 17 s | - |
| Kubernetes baseline | 11.5 % | 35.8 % | 270 s | pods restart; CrashLoopBackOff |

Their training goodput is dominated by synchronous DCP saves to a 1.2 TB SCRATCH_2 file system, not by
recovery; the kit's FSx default (PERSISTENT_2) makes its sync figures incomparable with these.

**Reference notes from a 2-core CPU machine like this one (reference/torch-on-cpu.md; single runs, +-30 %).**

| Mechanism (reference notes) | Kill -> first step | Hang -> first step |
|---|---|---|
| torchrun `--max-restarts`, `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` | 6.1 s | after the collective timeout |
| NVRx 0.4.1 ft_launcher | 7.3 s | 14.2 s |
| 90-line heartbeat launcher prototype (5 s timeout) | 5.7 s | 10.9 s |
"""


def render(runs: Sequence[BenchRun], *, quick: bool, sections_dir: Path = SECTIONS) -> str:
    """The whole benchmarks document: header, machine, runs, every part's section, the anchors' figures."""
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = "python -m bench.run_all --quick" if quick else "python -m bench.run_all"
    note = " (quick mode: reduced sizes, not the recorded figures)" if quick else ""
    lines = [
        "# Benchmarks",
        "",
        f"<!-- GENERATED by `{command}`; the per-part sections come from docs/benchmarks/*.md, written by",
        "     each benchmark. Do not edit by hand. -->",
        "",
        f"Rebuilt {when} by `{command}`{note}. Each section names the command that produced its figures.",
        "",
        "## Machine",
        "",
        "The machine this page was rebuilt on, not necessarily the one a section was measured on: the 2-core",
        "VMs differ between days, and each section gives its date and command.",
        "",
        "| | |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in machine_info()),
        "",
    ]
    if runs:
        lines += [
            "## Runs",
            "",
            "| benchmark | command | exit | wall | key figures |",
            "|---|---|---|---|---|",
        ]
        for r in runs:
            key = r.result.removeprefix("RESULT ") if r.result else "-"
            lines.append(f"| {r.name} | `{r.command}` | {r.returncode} | {r.wall_s:.0f} s | {key} |")
        lines.append("")
    parts = sorted(sections_dir.glob("*.md")) if sections_dir.is_dir() else []
    for part in parts:
        lines += [part.read_text(encoding="utf-8").strip(), ""]
    if not parts:
        lines += ["_No benchmark sections in docs/benchmarks/ yet._", ""]
    lines.append(ANCHORS)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run_all", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="each benchmark's --quick mode")
    parser.add_argument(
        "--only", action="append", default=[], metavar="NAME", help="run only these (repeatable)"
    )
    parser.add_argument("--merge-only", action="store_true", help="rebuild the document without running")
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds per benchmark (default 3600, quick 600)"
    )
    parser.add_argument("--output", type=Path, default=None, help="document to write (default by mode)")
    args = parser.parse_args(argv)

    available = discover()
    unknown = [n for n in args.only if n not in available]
    if unknown:
        print(
            f"error: no benchmark named {', '.join(unknown)}; available: {', '.join(available) or 'none'}",
            file=sys.stderr,
        )
        return 2
    if args.timeout is not None and args.timeout <= 0:
        print(f"error: --timeout must be > 0 seconds, got {args.timeout}", file=sys.stderr)
        return 2
    timeout = args.timeout or (600.0 if args.quick else 3600.0)
    runs: list[BenchRun] = []
    if not args.merge_only:
        for name in args.only or available:
            runs.append(run_one(name, quick=args.quick, timeout_s=timeout))
    output = args.output or (QUICK_OUTPUT if args.quick else OUTPUT)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(render(runs, quick=args.quick), encoding="utf-8")

    for r in runs:
        status = "ok" if r.returncode == 0 else f"FAILED (exit {r.returncode})"
        print(f"{r.name:<16} {status:<18} {r.wall_s:7.1f} s  {r.result or ''}")
    print(f"wrote {output}")
    return 0 if all(r.returncode == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
