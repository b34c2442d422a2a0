"""`python -m bench.elastic [--quick]`: a node lost with no spare, elastic (shrink, grow back) against the kit
as it was (wait for the replacement), side by side in one run, on 4 local pods (k8s/local.py).

Cases, each a real `python -m fsdpkit.k8s local` Job (4 pods x 1 rank, gloo, the tiny Llama, 12 samples per
optimizer step, async checkpoints every CKPT_INTERVAL steps):
  kill     one rank killed (SIGKILL) at step FAULT_STEP: the kit's single-rank recovery, the yardstick of
           shrink_s;
  elastic  pod 2's node lost (every process SIGKILLed) at step FAULT_STEP, MIN_NODES=3: the other three go
           on after ELASTIC_WAIT_S, resharded onto 3 ranks; the replacement pod starts WAIT x later and is
           taken back at a step boundary (resharded onto 4);
  wait     the same loss without MIN_NODES: the three wait for the replacement (the kit before elastic).
  reference  the same job fault-free under torchrun (4 ranks): what every step must consume;
  order    the same job fault-free on a fixed 2 and a fixed 3 ranks: how far the reduction order alone moves
           the loss.
The replacement's delay is scaled: 10 minutes on p5 is 35 single-rank recoveries of the kit there (the
study's heartbeat launcher: 17 s), so here it is 35 x this run's kill recovery. Both fault runs are judged
over the same wall time: from their first trainer start to 1.5 x the delay after the fault (the replacement
comes two thirds into that window); goodput_ratio = the elastic run's useful steps by then / the wait run's.

The loss tolerance, from fp32 reduction order: another number of ranks sums the same mean gradient in
another order, ~1e-7 relative at a step (the tests' 12 steps: 6e-8), and training amplifies any such
difference as it goes (measured: 4e-8 at step 21, 1e-5 at 51, 4e-3 at 117 between two fault-free runs on 3
and 4 ranks). So the tolerance is what the order alone does over the same steps, measured in this run (the
larger of the fixed 2- and 3-rank runs' differences from the 4-rank one), doubled (the elastic run changes
the order twice, and the largest of a growing, noisy difference varies between runs), never below LOSS_RTOL.

RESULT exactly_once (every step consumed the reference's samples, each once) global_batch_kept
max_loss_rel_diff (against the reference) loss_tolerance shrink_s (fault -> end of the first step on 3
ranks) kill_recovery_s goodput_ratio. Goals: exactly_once = 1, global_batch_kept = 1, max_loss_rel_diff <=
loss_tolerance, shrink_s <= 3 x kill_recovery_s, goodput_ratio >= 1.5.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from fsdpkit.analysis.batch_ledger import (
    LedgerComparison,
    StepBatch,
    compare_ledgers,
    step_batches,
    useful_steps,
)
from fsdpkit.analysis.metrics import load_run_metrics
from fsdpkit.contracts.ports import free_port_run
from fsdpkit.runtime.events import read_events

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks" / "elastic.md"
NODES, MIN_NODES = 4, 3
GLOBAL_BATCH, BATCH_SIZE, SEQ_LEN = 12, 1, 64
FAULT_STEP = 6
CKPT_INTERVAL = 2
ELASTIC_WAIT_S = 1
"""The survivors' wait for a replacement before they shrink (whole seconds: the rendezvous' last call)."""
P5_WAIT_RECOVERIES = 600 / 17
"""10 minutes on p5, in single-rank recoveries of a heartbeat launcher there (the study: 17 s)."""
WINDOW_FACTOR = 1.5
"""The judged window ends this many replacement delays after the fault."""
BUDGET_STEPS = 10_000
"""training.steps of every run (the LR schedule spans it); the fault runs are stopped long before it."""
LOSS_RTOL = 1e-4
"""The least loss tolerance against the fixed-size reference (the tests' bound over a dozen steps)."""
ORDER_FACTOR = 2.0
"""The tolerance is this many times the fixed runs' largest difference from the 4-rank one."""
ORDER_RANKS = (2, 3)
"""The fixed world sizes whose fault-free runs measure what the reduction order alone does."""
JOB = [
    f"NODES={NODES}", f"SEQ_LEN={SEQ_LEN}", f"BATCH_SIZE={BATCH_SIZE}",
    f"TRAIN.training.global_batch={GLOBAL_BATCH}",
    "TRAIN.optim.warmup_steps=3", f"CHECKPOINT_INTERVAL={CKPT_INTERVAL}", "CHECKPOINT_MODE=async",
    "MONITOR_INTERVAL_S=0.1", "LOG_EVERY=10", "MAX_RESTARTS=8",
]  # fmt: skip


@dataclass
class Run:
    name: str
    run_dir: Path
    returncode: int
    wall_s: float
    fault_ts: float | None = None
    ledger: dict[int, StepBatch] = field(default_factory=dict)


def run_dir_of(workdir: Path, run_id: str) -> Path:
    return workdir / run_id / "volumes" / "kit-local-runs" / "runs" / run_id


def fault_ts(run_dir: Path) -> float | None:
    """When the run's injected fault fired (its first `fault` event)."""
    return min((float(e["ts"]) for e in read_events(run_dir) if e["kind"] == "fault"), default=None)


def local_job(
    workdir: Path, run_id: str, overrides: list[str], *, steps: int, stop_after_fault_s: float | None = None,
    replace_after_s: float = 0.0, timeout_s: float = 600,
) -> Run:  # fmt: skip
    """`python -m fsdpkit.k8s local` with the bench's job; with `stop_after_fault_s` it is interrupted
    (SIGINT, the
    runner stops its pods) that long after the fault fired, else it runs to its end."""
    run_dir = run_dir_of(workdir, run_id)
    argv = [
        sys.executable, "-m", "fsdpkit.k8s", "local", *JOB, f"STEPS={steps}", f"RUN_ID={run_id}", *overrides,
        "--workdir", str(workdir), "--timeout", str(timeout_s),
        *(["--lost-pod-replace-after", f"{replace_after_s:g}"] if replace_after_s else []),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=_default_sigint,  # a background shell starts us with SIGINT ignored: the runner needs it
    )  # fmt: skip
    if stop_after_fault_s is not None:
        threading.Thread(
            target=_stop_after_fault, args=(proc, run_dir, stop_after_fault_s), daemon=True
        ).start()
    out, _ = proc.communicate(timeout=timeout_s + 120)
    run = Run(run_id, run_dir, proc.returncode, time.monotonic() - t0)
    if (run_dir / "events").is_dir():
        run.fault_ts = fault_ts(run_dir)
        run.ledger = step_batches(run_dir)
    if proc.returncode != 0 and stop_after_fault_s is None:
        print(out[-3000:], file=sys.stderr)
    return run


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop_after_fault(proc: subprocess.Popen[str], run_dir: Path, after_s: float) -> None:
    while proc.poll() is None:
        with contextlib.suppress(OSError, ValueError, KeyError):
            at = fault_ts(run_dir) if (run_dir / "events").is_dir() else None
            if at is not None and time.time() > at + after_s:
                proc.send_signal(signal.SIGINT)
                return
        time.sleep(0.2)


def reference(workdir: Path, steps: int, *, ranks: int = NODES) -> dict[int, StepBatch]:
    """The same job fault-free on `ranks` ranks under torchrun (checkpoints off), stopped after `steps` of
    the same BUDGET_STEPS (so the LR schedule is the fault runs'): what every step consumes."""
    root = workdir / f"reference-{ranks}"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(ranks),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port_run()}", "--max-restarts", "0",
        "--log-dir", str(root / "logs"), "-m", "fsdpkit.trainer", "--run.id", "ref", "--run.root", str(root),
        "--model.name", "tiny", "--data.seq_len", str(SEQ_LEN), "--data.batch_size", str(BATCH_SIZE),
        "--training.global_batch", str(GLOBAL_BATCH), "--optim.warmup_steps", "3", "--training.steps",
        str(BUDGET_STEPS), "--training.stop_at", str(steps), "--training.log_every", "50",
        "--checkpoint.mode", "off",
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True, timeout=1200)
    return step_batches(root / "ref")


def shrink_s(ledger: dict[int, StepBatch], fault_at: float, nodes: int = NODES) -> float | None:
    """Fault -> the end of the first step computed on fewer ranks than `nodes` (its kept computation or a
    later one: the first such step in time)."""
    ends = [b.ts for b in ledger.values() if b.world_size < nodes and b.ts > fault_at]
    return min(ends) - fault_at if ends else None


def first_ts(run_dir: Path) -> float:
    return min(float(e["ts"]) for e in read_events(run_dir) if e.get("role") == "trainer")


@dataclass(kw_only=True)
class Figures:
    kill_recovery_s: float | None
    replace_after_s: float
    window_s: float
    """From the fault to the end of the judged window."""
    shrink_s: float | None
    useful_elastic: int
    useful_wait: int
    ledger: LedgerComparison
    worlds: list[int]
    order_diff: float
    """The fixed runs' largest relative loss difference from the 4-rank one (the order alone)."""

    @property
    def loss_tolerance(self) -> float:
        return max(LOSS_RTOL, ORDER_FACTOR * self.order_diff)

    @property
    def goodput_ratio(self) -> float:
        return self.useful_elastic / self.useful_wait if self.useful_wait else float("inf")

    def result_line(self) -> str:
        ratio = self.goodput_ratio
        return (
            f"RESULT exactly_once={int(self.ledger.exactly_once and self.ledger.same_batches)} "
            f"global_batch_kept={int(self.ledger.global_batch_kept)} "
            f"max_loss_rel_diff={self.ledger.max_loss_rel_diff:.2g} loss_tolerance={self.loss_tolerance:.2g} "
            f"shrink_s={_f(self.shrink_s)} "
            f"kill_recovery_s={_f(self.kill_recovery_s)} goodput_ratio={ratio:.2f}"
        )

    def goals(self) -> dict[str, bool]:
        three = 3 * self.kill_recovery_s if self.kill_recovery_s else None
        return {
            "exactly_once = 1": self.ledger.exactly_once and self.ledger.same_batches,
            "global_batch_kept = 1": self.ledger.global_batch_kept,
            "max_loss_rel_diff <= loss_tolerance": self.ledger.max_loss_rel_diff <= self.loss_tolerance,
            "shrink_s <= 3 x kill_recovery_s": bool(self.shrink_s and three and self.shrink_s <= three),
            "goodput_ratio >= 1.5": self.goodput_ratio >= 1.5,
        }


def _f(value: float | None) -> str:
    return "nan" if value is None else f"{value:.2f}"


def judge(
    elastic: Run, wait: Run, ref: dict[int, StepBatch], orders: list[dict[int, StepBatch]], *,
    kill_recovery_s: float | None, replace_after_s: float,
) -> Figures:  # fmt: skip
    """The figures of one bench run: both fault runs over the same window, the elastic one against `ref`."""
    window = WINDOW_FACTOR * replace_after_s
    assert elastic.fault_ts is not None and wait.fault_ts is not None  # main() checked it
    by_elastic = elastic.fault_ts + window
    span = by_elastic - first_ts(elastic.run_dir)
    by_wait = first_ts(wait.run_dir) + span  # the same wall time from each run's own start
    ledger = compare_ledgers(elastic.ledger, ref, prefix=True)
    return Figures(
        kill_recovery_s=kill_recovery_s, replace_after_s=replace_after_s, window_s=window,
        shrink_s=shrink_s(elastic.ledger, elastic.fault_ts),
        useful_elastic=useful_steps(elastic.ledger, by_elastic),
        useful_wait=useful_steps(wait.ledger, by_wait),
        ledger=ledger, worlds=ledger.worlds,
        order_diff=max(compare_ledgers(order, ref).max_loss_rel_diff for order in orders),
    )  # fmt: skip


def render(fig: Figures, *, quick: bool, elapsed_s: float) -> str:
    goals = "\n".join(f"| {goal} | {'met' if ok else 'NOT met'} |" for goal, ok in fig.goals().items())
    same = fig.ledger.exactly_once and fig.ledger.same_batches
    lines = [
        "## Elastic: a node lost with no spare, shrink and grow back vs waiting for the replacement",
        "",
        f"Command: `python -m bench.elastic{' --quick' if quick else ''}` ({elapsed_s / 60:.1f} min on this "
        "machine, every case in this one run).",
        f"{NODES} local pods x 1 rank (gloo), the tiny Llama, {GLOBAL_BATCH} samples per optimizer step "
        f"(micro-batch {BATCH_SIZE}: 3 per rank on 4 ranks, 4 on 3), async checkpoints every {CKPT_INTERVAL} "
        f"steps; pod 2's node lost at step {FAULT_STEP}, its replacement started {fig.replace_after_s:.1f} s "
        f"later (10 minutes on p5 = {P5_WAIT_RECOVERIES:.0f} single-rank recoveries there, scaled by this "
        f"run's kill recovery). elastic: MIN_NODES={MIN_NODES}, ELASTIC_WAIT_S={ELASTIC_WAIT_S}; wait: the "
        "kit before elastic (the three wait for the replacement). Both judged over the same wall time: from "
        f"their first start to {WINDOW_FACTOR:g} x the delay after the fault.",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| single-rank kill recovery (kit) | {_f(fig.kill_recovery_s)} s |",
        f"| shrink: fault -> first step on {MIN_NODES} ranks | {_f(fig.shrink_s)} s |",
        f"| world sizes of the elastic run | {' -> '.join(map(str, fig.worlds))} |",
        f"| useful steps in the window, elastic / wait | {fig.useful_elastic} / {fig.useful_wait} |",
        f"| goodput ratio | {fig.goodput_ratio:.2f} |",
        f"| steps compared with the fault-free 4-rank run | {fig.ledger.steps} |",
        f"| every sample once, the same global batches | {'yes' if same else fig.ledger.summary()} |",
        f"| largest relative loss difference | {fig.ledger.max_loss_rel_diff:.2g} |",
        f"| the same, fault-free on fixed {'/'.join(map(str, ORDER_RANKS))} ranks | {fig.order_diff:.2g} |",
        f"| loss tolerance: max({LOSS_RTOL:g}, {ORDER_FACTOR:g} x that) | {fig.loss_tolerance:.2g} |",
        "",
        "| goal | |",
        "| --- | --- |",
        goals,
        "",
        fig.result_line(),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.elastic", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the same cases (one run each); no doc written")
    parser.add_argument("--keep", action="store_true", help="keep the run folders (printed)")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="kit-bench-elastic-"))
    started = time.monotonic()
    kill = local_job(workdir, "kill", [f"FAULT_SPEC=kill:step={FAULT_STEP}:rank=1"], steps=FAULT_STEP + 4)
    faults = load_run_metrics(kill.run_dir).faults if kill.returncode == 0 else []
    kill_recovery = faults[0].recovery_s if faults else None
    print(f"kill: exit {kill.returncode}, recovery {_f(kill_recovery)} s", flush=True)
    if kill_recovery is None:
        print(
            "error: the single-rank kill run did not recover; nothing to scale the wait by", file=sys.stderr
        )
        return 1
    delay = P5_WAIT_RECOVERIES * kill_recovery
    node = f"FAULT_SPEC=node:step={FAULT_STEP}:node=2"
    common = dict(steps=BUDGET_STEPS, stop_after_fault_s=WINDOW_FACTOR * delay + 5, replace_after_s=delay)
    elastic = local_job(
        workdir, "elastic", [node, f"MIN_NODES={MIN_NODES}", f"ELASTIC_WAIT_S={ELASTIC_WAIT_S}"], **common
    )
    worlds = sorted({b.world_size for b in elastic.ledger.values()})
    print(f"elastic: {len(elastic.ledger)} steps, worlds {worlds}", flush=True)
    wait = local_job(workdir, "wait", [node], **common)
    print(f"wait: {len(wait.ledger)} steps", flush=True)
    if elastic.fault_ts is None or wait.fault_ts is None or not elastic.ledger or not wait.ledger:
        print("error: a fault run never reached its fault (see the pods' logs with --keep)", file=sys.stderr)
        return 1
    steps = max(elastic.ledger)
    ref = reference(workdir, steps)
    orders = [reference(workdir, steps, ranks=r) for r in ORDER_RANKS]
    fig = judge(elastic, wait, ref, orders, kill_recovery_s=kill_recovery, replace_after_s=delay)
    text = render(fig, quick=args.quick, elapsed_s=time.monotonic() - started)
    print(text)
    if not args.quick:
        DOC.parent.mkdir(parents=True, exist_ok=True)
        DOC.write_text(text, encoding="utf-8")
        print(f"wrote {DOC.relative_to(REPO)}")
    if args.keep:
        print(f"run folders kept in {workdir}")
    else:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    print(fig.result_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
