"""`python -m ops.plan [--nodes N] [--model NAME] [--spares K] [--json] [--png PATH]` (`make plan`): the
goodput each recovery mechanism keeps on a job before the cluster is rented, what it loses per day and in
dollars, the checkpoint interval and the spares to keep (docs/plan.md).

Defaults come from `cdk.json` (the GPU node count and type, the region, the FSx throughput) and the kit's
model shapes (the checkpoint: 12 bytes per parameter, fp32 weights and Adam's two moments); the step time
from the model's FLOPs at `--mfu` of the GPUs' peak. No AWS call: prices from ops/prices.json (dated,
labelled).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from cliargs import OneLineParser, float_arg, int_arg, output_file_problem
from infra.config import load_config
from infra.errors import ConfigError
from ops.cli import parse_once
from ops.cost.prices import ec2_hourly
from ops.plan.failures import FAILURE_CLASSES, LLAMA3, FailureRates, PlanInputError
from ops.plan.model import MECHANISM_TITLES, MECHANISMS, Job, Outcome, evaluate, spares_needed
from training.shapes import MODEL_CONFIGS
from training.throughput import PEAK_BF16_FLOPS

REPO = Path(__file__).resolve().parents[2]
GPUS_PER_NODE = 8
STATE_BYTES_PER_PARAM = 12
"""fp32 weights + Adam's two moments: what one save writes per parameter (training/memory_plan.py)."""
NODE_SWEEP = (16, 32, 64, 128, 256, 512, 1024, 2048)


def step_seconds(params: int, *, nodes: int, batch_tokens: int, mfu: float, peak: float) -> float:
    """One optimizer step at `mfu` of the peak: 6 FLOPs per parameter per token over every GPU."""
    return 6.0 * params * batch_tokens / (nodes * GPUS_PER_NODE * peak * mfu)


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="python -m ops.plan", description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--nodes", type=int_arg(lo=1), help="training nodes (default cdk.json gpu.max_nodes)")
    p.add_argument("--spares", type=int_arg(lo=0), help="hot spares (default: the plan's own)")
    p.add_argument(
        "--model",
        choices=sorted(MODEL_CONFIGS),
        default="llama3.1-70b",
        help="a kit model shape (default llama3.1-70b)",
    )
    p.add_argument("--batch-tokens", type=int_arg(lo=1), default=4 * 1024 * 1024)
    p.add_argument("--mfu", type=float_arg(lo=0.0, hi=1.0, lo_open=True), default=0.4, help="default 0.4")
    p.add_argument(
        "--price", type=float_arg(lo=0.0, lo_open=True), help="USD per node-hour (default prices.json)"
    )
    p.add_argument("--replacement-s", type=float_arg(lo=0.0), default=900.0, help="a lost node's replacement")
    for cls in ("soft", "node", "drain"):
        p.add_argument(
            f"--rate-{cls}", type=float_arg(lo=0.0), help=f"{cls} faults per node-hour (default Llama 3)"
        )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument(
        "--png", type=Path, help="also draw goodput against nodes (16 to 2,048), one line per mechanism"
    )
    return p


def _context() -> dict[str, Any]:
    return json.loads((REPO / "cdk.json").read_text(encoding="utf-8"))["context"]


def plan(argv: list[str] | None = None) -> tuple[dict[str, Any], list[Outcome], Job, FailureRates]:
    args = parse_once(build_parser(), argv)
    if args.png is not None and (problem := output_file_problem(args.png, "--png")):
        raise PlanInputError(problem)
    # The plan needs none of the Kubernetes objects' checks (they import the CDK, i.e. start node.js).
    cfg = load_config({**_context(), "kubernetes.deploy_objects": False})
    nodes = args.nodes or cfg.gpu.max_nodes
    shape = MODEL_CONFIGS[args.model]
    params = shape.num_params()
    peak = PEAK_BF16_FLOPS["H100"]  # p5; p5en's H200 has the same dense bf16 peak
    given = {cls: getattr(args, f"rate_{cls}") for cls in FAILURE_CLASSES}
    given = {cls: rate for cls, rate in given.items() if rate is not None}
    source = (
        LLAMA3.source
        if not given
        else "given"
        if len(given) == len(FAILURE_CLASSES)
        else (f"{LLAMA3.source}; {', '.join(given)} given")
    )
    rates = FailureRates(**{cls: given.get(cls, LLAMA3.of(cls)) for cls in FAILURE_CLASSES}, source=source)
    price = args.price or ec2_hourly(None, cfg.gpu.instance_type, cfg.region).usd
    if price is None:
        price = ec2_hourly(None, cfg.gpu.instance_type, "us-east-1").usd
    if price is None:
        raise PlanInputError(f"no price for {cfg.gpu.instance_type} in ops/prices.json: pass --price USD")
    tib = cfg.storage.storage_gib / 1024
    shared_gbps = tib * (cfg.storage.effective_throughput_per_tib or 200) / 1000
    base = Job(
        nodes=nodes,
        step_s=step_seconds(params, nodes=nodes, batch_tokens=args.batch_tokens, mfu=args.mfu, peak=peak),
        checkpoint_gb=STATE_BYTES_PER_PARAM * params / 1e9,
        shared_gbps=shared_gbps,
        price_per_node_hour=price,
    )
    base = dataclasses.replace(
        base, phases=dataclasses.replace(base.phases, replacement_s=args.replacement_s)
    )
    spares = args.spares if args.spares is not None else spares_needed(base, rates)
    job = dataclasses.replace(base, spares=spares)
    outcomes = [evaluate(m, job, rates) for m in MECHANISMS]
    header = {
        "nodes": nodes, "spares": spares, "spares_recommended": spares_needed(base, rates),
        "model": args.model, "params": params, "checkpoint_gb": job.checkpoint_gb, "step_s": job.step_s,
        "shared_gbps": shared_gbps, "price_per_node_hour": price,
        "failure_rates_per_node_hour": dataclasses.asdict(rates),
    }  # fmt: skip
    if args.png is not None:
        draw(args.png, job, rates)
    return {"json": args.json, "png": args.png, **header}, outcomes, job, rates


def draw(png: Path, job: Job, rates: FailureRates) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for m in MECHANISMS:
        ys = []
        for n in NODE_SWEEP:
            sized = dataclasses.replace(job, nodes=n, step_s=job.step_s * job.nodes / n)
            ys.append(evaluate(m, sized, rates).goodput)
        ax.plot(NODE_SWEEP, ys, marker="o", label=MECHANISM_TITLES[m])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("nodes (8 GPUs each)")
    ax.set_ylabel("expected strict goodput")
    ax.set_title(f"{job.checkpoint_gb:,.0f} GB checkpoint, {job.spares} spare(s), {rates.source}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png


def main(argv: list[str] | None = None) -> int:
    try:
        header, outcomes, job, rates = plan(argv)
    except (PlanInputError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if header.pop("json"):
        rows = [{**dataclasses.asdict(o), "title": MECHANISM_TITLES[o.mechanism]} for o in outcomes]
        header["png"] = None if header["png"] is None else str(header["png"])
        print(json.dumps({**header, "mechanisms": rows}, indent=2))
        return 0
    png = header.pop("png")
    print(
        f"{header['nodes']} nodes x {GPUS_PER_NODE} GPUs, {header['model']} "
        f"({header['params'] / 1e9:.1f} B params, "
        f"{job.checkpoint_gb:,.0f} GB a save), step {job.step_s:.1f} s, "
        f"FSx {header['shared_gbps']:.0f} GB/s, "
        f"${header['price_per_node_hour']:.2f}/node-hour, {job.spares} spare(s) "
        f"({header['spares_recommended']} keep the chance of a loss finding none below 1 %); {rates.source}"
    )
    print(f"{'mechanism':31} {'goodput':>7} {'interval':>9} {'lost h/day':>10} {'waiting':>8} {'$/day':>11}")
    for o in outcomes:
        hours = sum(o.lost_per_day_s.values()) / 3600
        print(
            f"{MECHANISM_TITLES[o.mechanism]:31} {o.goodput:7.3f} {o.interval_s:8.0f}s {hours:10.2f} "
            f"{o.lost_per_day_s['waiting'] / 3600:8.2f} {o.dollars_lost_per_day:11,.0f}"
        )
    if png is not None:
        print(f"goodput against nodes: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
