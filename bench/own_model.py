"""Your model, data and script: the example under the demo's faults, beside the same script with no kit.

`python -m bench.own_model [--quick]` builds everything offline (a byte-level BPE trained on the repo's
corpus, `python -m fsdpkit.data.prepare_data` shards, the 2-layer HF Llama config in tests/fixtures/hf),
then runs `examples/hf_llama/train.py` on 2 ranks x 1 thread (gloo), in one run:
- plain: `--plain` under torchrun: the same model, data, AdamW and schedule, no kit call, no checkpoint;
- kit: the API (async checkpoints, in-process restart on), fault-free, saving only its final step, under
  torchrun as the plain run (the reference, and the step times with the API);
- kit+faults: under the kit launcher (`python -m fsdpkit.launcher`) with the demo's faults (a kill, an
  exception, a hang on rank 1) and its checkpoint interval.
It prints per run the figures and, last,
`RESULT faults=<fired> recovered=<n> unfired=<n> equal_on_disk=<1|0> exactly_once=<1|0>
loss_drop=<first - last loss, kit fault-free> api_overhead=<median step period with the API / without>
api_ms_per_step=<the same medians' difference, ms>`.
api_overhead compares step periods (the start of one step to the start of the next, so the step event,
the heartbeat, the fault checks and the drain agreement all count) over the fault-free runs, which save
only at the end (the save's own cost is bench.checkpoint's); the first two steps are warm-up.
It also prints the step events' volume (lines and bytes per rank and step, from the fault-free run's
files) and what that volume is at SCALE_NODES nodes of SCALE_RANKS ranks at one step a second.
equal_on_disk: the final checkpoints of kit and kit+faults, verified and loaded back from disk, are bitwise
equal. exactly_once: every sample id the final trajectory used appears once, and the set is the fault-free
run's (a replayed step's ids are taken from its last computation). Goals: every fault recovered, equal on
disk, exactly once, loss_drop > 0, api_overhead <= 1.05.
Full mode (the demo's full scenario, 36 steps, 3 repetitions of plain and kit interleaved) writes
docs/benchmarks/own_model.md; --quick (26 steps, two of each) only prints.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from fsdpkit.analysis.metrics import load_events, load_run_metrics
from fsdpkit.contracts.ports import free_port_run
from fsdpkit.resilience.checkpoint.compare import compare_checkpoints, final_checkpoint

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "hf_llama" / "train.py"
TINY_CONFIG = REPO / "tests" / "fixtures" / "hf" / "tiny-llama"
DOC = REPO / "docs" / "benchmarks" / "own_model.md"
NOTES_MARK = "<!-- notes below: written by hand, kept when bench.own_model rewrites this file -->"
WORLD = 2
SCALE_NODES, SCALE_RANKS, SCALE_STEP_S = 1024, 8, 1.0
"""The projection's job: 1,024 p5 nodes of 8 ranks at one step a second."""


@dataclass(frozen=True, kw_only=True)
class Scale:
    steps: int
    interval: int
    faults: str
    reps: int


QUICK = Scale(
    steps=26, interval=4, faults="kill:step=6:rank=1,exception:step=12:rank=1,hang:step=23:rank=1", reps=2
)
FULL = Scale(
    steps=36, interval=6, faults="kill:step=10:rank=1,exception:step=19:rank=1,hang:step=28:rank=1", reps=3
)
"""The demo's two scenarios (demo/run.py), so a user's script is tested under the same faults."""


def _env(workdir: Path) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", TMPDIR=str(workdir))
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.pop("KIT_HEARTBEAT_DIR", None)
    env.pop("KIT_CONFIG", None)
    return env


def prepare(workdir: Path) -> tuple[Path, Path]:
    """(model folder, shard folder): a tokenizer trained here, the corpus tokenized with it."""
    from tests.fixtures.tokenizers import corpus_files, train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(workdir / "tokenizer", vocab_size=512)
    shards = workdir / "shards"
    cmd = [
        sys.executable,
        "-m",
        "fsdpkit.data.prepare_data",
        "--tokenizer",
        str(tokenizer),
        "--out",
        str(shards),
    ]
    subprocess.run([*cmd, *map(str, corpus_files())], cwd=REPO, env=_env(workdir), check=True)
    return TINY_CONFIG, shards


def _script_args(model: Path, shards: Path) -> list[str]:
    return [str(EXAMPLE), "--model-dir", str(model), "--data-dir", str(shards), "--seq-len", "64"]


def torchrun(name: str) -> list[str]:
    """torchrun on a free port: the launcher of both timing runs, so only the API differs between them."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD), "--rdzv-backend",
            "c10d", f"--rdzv-endpoint=127.0.0.1:{free_port_run()}", "--rdzv-id", name]  # fmt: skip


def run_plain(workdir: Path, model: Path, shards: Path, scale: Scale, index: int) -> dict[str, list[float]]:
    cmd = [*torchrun(f"plain{index}"), *_script_args(model, shards), "--plain", "--run.id", "plain",
           "--training.steps", str(scale.steps)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=_env(workdir), capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"error: the plain run failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PLAIN "))
    return json.loads(line[len("PLAIN ") :])


def run_kit(
    workdir: Path, model: Path, shards: Path, scale: Scale, name: str, faults: str, *, interval: int
) -> Path:
    """The example with the API; returns its run folder. With faults under the kit launcher (its heartbeat
    sees the hang); fault-free under torchrun, as the plain run, so the step times differ by the API alone."""
    root = workdir / "runs"
    run_dir = root / name
    kit = [
        sys.executable,
        "-m",
        "fsdpkit.launcher",
        "--standalone",
        "--nproc-per-node",
        str(WORLD),
        "--monitor-interval",
        "0.1",
        "--log-dir",
        str(workdir / "logs" / name),
        "--run-dir",
        str(run_dir),
    ]
    cmd = [*(kit if faults else torchrun(name)), *_script_args(model, shards),
           "--sample-log", str(run_dir / "samples"), "--run.id", name, "--run.root", str(root),
           "--training.steps", str(scale.steps),
           "--training.log_every", "5", "--checkpoint.interval", str(interval),
           "--inprocess.enabled", "true", "--fault.spec", faults]  # fmt: skip
    env = _env(workdir)
    if not faults:  # the beats are written as under the kit launcher (nobody reads them): their cost counts
        env["KIT_HEARTBEAT_DIR"] = str(workdir / "beats" / name)
        Path(env["KIT_HEARTBEAT_DIR"]).mkdir(parents=True)
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"error: run {name} failed (exit {proc.returncode}): {proc.stderr[-3000:]}")
    return run_dir


def trajectory(run_dir: Path) -> dict[str, dict[int, list[int]]]:
    """Per rank's sample log, the final trajectory: step -> the sample ids of that step's last computation
    (a step computed again after a resume replaces the earlier one)."""
    out: dict[str, dict[int, list[int]]] = {}
    for log in sorted(run_dir.glob("samples.rank*")):
        by_step: dict[int, list[int]] = {}
        for line in log.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            by_step[int(record["step"])] = [int(i) for i in record["ids"]]
        out[log.name] = dict(sorted(by_step.items()))
    return out


def final_ids(run_dir: Path) -> list[int]:
    """Every sample id of the final trajectory, rank by rank, step by step."""
    return [i for steps in trajectory(run_dir).values() for ids in steps.values() for i in ids]


def exactly_once(run_dir: Path, reference: Path, steps: int) -> bool:
    """Every step of every rank in the final trajectory, no sample twice, the reference run's samples."""
    ids = final_ids(run_dir)
    complete = all(list(s) == list(range(1, steps + 1)) for s in trajectory(run_dir).values())
    return complete and len(ids) == len(set(ids)) and sorted(ids) == sorted(final_ids(reference))


def step_periods(run_dir: Path) -> tuple[list[float], list[float]]:
    """(rank 0's step periods after the warm-up, its losses by step) from a fault-free run's events."""
    steps = sorted(
        (e for e in load_events(run_dir) if e["kind"] == "step" and e.get("rank") == 0),
        key=lambda e: float(e["t_start"]),
    )
    periods = []
    for a, b in itertools.pairwise(steps):
        n = int(a["step"])
        if int(b["step"]) == n + 1 and n > 2:
            periods.append(float(b["t_start"]) - float(a["t_start"]))
    losses = [float(e["loss"]) for e in steps]
    return periods, losses


def step_event_volume(run_dir: Path, steps: int) -> tuple[float, float]:
    """(step-event lines per rank and step, bytes per line) in a fault-free run's trainer event files."""
    lines = size = 0
    for path in (run_dir / "events").glob("trainer-*.jsonl"):
        for line in path.read_bytes().splitlines(keepends=True):
            if b'"kind":"step"' in line:
                lines, size = lines + 1, size + len(line)
    return lines / (WORLD * steps), size / max(lines, 1)


def at_scale(lines_per_rank_step: float, line_bytes: float) -> str:
    """What the step events are at SCALE_NODES x SCALE_RANKS ranks and one step per SCALE_STEP_S."""
    ranks = SCALE_NODES * SCALE_RANKS
    per_s = ranks * lines_per_rank_step / SCALE_STEP_S
    return (
        f"step events: {lines_per_rank_step:.2f} line of {line_bytes:.0f} bytes per rank and step; at "
        f"{SCALE_NODES:,} nodes x {SCALE_RANKS} ranks, {SCALE_STEP_S:g} s a step: {per_s:,.0f} appends/s "
        f"({per_s * line_bytes / 1e6:.1f} MB/s) in all, {per_s / SCALE_NODES:.0f}/s per node, each one "
        "write(2) to its own file's page cache"
    )


def plain_periods(plain: dict[str, list[float]]) -> list[float]:
    """The plain loop's step times over the same steps as `step_periods` keeps (1-based step numbers)."""
    return [t for n, t in enumerate(plain["step_s"], start=1) if 2 < n < len(plain["step_s"])]


def measure(scale: Scale, workdir: Path) -> tuple[dict[str, float], str]:
    model, shards = prepare(workdir)
    kit_periods: list[float] = []
    base_periods: list[float] = []
    reference = None
    t0 = time.time()
    for rep in range(scale.reps):  # interleaved, so a slow minute of the machine hits both
        base_periods += plain_periods(run_plain(workdir, model, shards, scale, rep))
        ref = run_kit(workdir, model, shards, scale, f"kit-{rep}", "", interval=scale.steps)
        kit_periods += step_periods(ref)[0]
        reference = reference or ref
    assert reference is not None
    faulted = run_kit(workdir, model, shards, scale, "kit-faults", scale.faults, interval=scale.interval)
    m = load_run_metrics(faulted)
    losses = step_periods(reference)[1]
    equal = compare_checkpoints(final_checkpoint(faulted), final_checkpoint(reference))
    result = {
        "faults": len(m.faults),
        "recovered": m.faults_recovered,
        "unfired": len(m.faults_unfired),
        "equal_on_disk": int(equal.equal),
        "exactly_once": int(exactly_once(faulted, reference, scale.steps)),
        "loss_drop": losses[0] - losses[-1],
        "api_overhead": statistics.median(kit_periods) / statistics.median(base_periods),
        "api_ms_per_step": (statistics.median(kit_periods) - statistics.median(base_periods)) * 1e3,
    }
    print(
        f"kit+faults: {m.steps_completed} steps, faults {[f'{f.kind}@{f.step}' for f in m.faults]}, "
        f"recovery {[round(f.recovery_s or 0, 2) for f in m.faults]} s, {m.restarts} group + "
        f"{m.inprocess_restarts} in-process restarts; {equal.summary()}",
        flush=True,
    )
    print(
        f"step period: kit {statistics.median(kit_periods) * 1e3:.2f} ms ({len(kit_periods)} steps), plain "
        f"{statistics.median(base_periods) * 1e3:.2f} ms ({len(base_periods)}); loss {losses[0]:.3f} -> "
        f"{losses[-1]:.3f}; {time.time() - t0:.0f} s",
        flush=True,
    )
    volume = at_scale(*step_event_volume(reference, scale.steps))
    print(volume, flush=True)
    return result, volume


def result_line(result: dict[str, float]) -> str:
    fmt = {"loss_drop": "{:.4f}", "api_overhead": "{:.3f}", "api_ms_per_step": "{:.2f}"}
    return "RESULT " + " ".join(f"{k}={fmt.get(k, '{}').format(v)}" for k, v in result.items())


def write_doc(result: dict[str, float], scale: Scale, line: str, volume: str) -> None:
    """The section's table and RESULT line; the hand-written notes after NOTES_MARK are kept."""
    today = time.strftime("%Y-%m-%d")
    old = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    _, mark, notes = old.partition(NOTES_MARK)
    DOC.write_text(
        "## Your own model and script: examples/hf_llama/train.py under faults (CPU)\n\n"
        f"`python -m bench.own_model`: a 2-layer HF Llama (tests/fixtures/hf/tiny-llama), a 512-token BPE "
        f"trained on the repo's corpus, 2 ranks x 1 thread (gloo), {scale.steps} steps, checkpoint every "
        f"{scale.interval}, faults `{scale.faults}`, {scale.reps} interleaved repetitions of plain and kit, "
        f"{today}.\n\n"
        "| figure | value | goal |\n|---|---:|---|\n"
        f"| faults fired / recovered / never fired | {result['faults']} / {result['recovered']} / "
        f"{result['unfired']} | all recovered, none unfired |\n"
        f"| final checkpoint equal on disk | {result['equal_on_disk']} | 1 |\n"
        f"| every sample exactly once | {result['exactly_once']} | 1 |\n"
        f"| loss drop (fault-free) | {result['loss_drop']:.3f} | > 0 |\n"
        f"| step period with the API / without | {result['api_overhead']:.3f} | <= 1.05 |\n"
        f"| the API's cost per step (the medians' difference) | {result['api_ms_per_step']:.2f} ms | |\n\n"
        f"{volume}.\n\n"
        f"{line}\n" + (f"\n{mark}{notes}" if mark else ""),
        encoding="utf-8",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.own_model", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="26 steps, two repetitions; prints only")
    args = parser.parse_args(argv)
    scale = QUICK if args.quick else FULL
    with tempfile.TemporaryDirectory(prefix="own-") as tmp:  # /tmp: short AF_UNIX paths for the zygote
        result, volume = measure(scale, Path(tmp))
    line = result_line(result)
    if not args.quick:
        write_doc(result, scale, line, volume)
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
