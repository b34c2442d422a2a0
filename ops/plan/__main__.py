"""`python -m fsdpkit.ops.plan [--nodes N] [--model NAME] [--spares K] [--replicate R|auto] [--json]
[--png PATH]` (`make plan`): the goodput each recovery mechanism keeps on a job before the cluster is rented,
what it loses per day and in dollars, the checkpoint interval, the spares to keep and the HSDP layout every
row assumes (docs/plan.md).

Defaults come from `cdk.json` (the GPU node count and type, the region, the FSx throughput) and the kit's
model shapes or a Hugging Face model folder (the checkpoint: 12 bytes per parameter, fp32 weights and Adam's
two moments); the step time from the model's FLOPs at `--mfu` of the GPUs' peak; the phase times from the
benchmarks' ops/plan/calibration.json, each printed with its source (ops/plan/planner.py). No AWS
call: prices from ops/prices.json (dated, labelled).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from fsdpkit.contracts.cliargs import OneLineParser, float_arg, int_arg, output_file_problem, program
from fsdpkit.contracts.shapes import MODEL_CONFIGS
from fsdpkit.infra.errors import ConfigError
from fsdpkit.ops.cli import parse_once
from fsdpkit.ops.plan.calibration import CalibrationError
from fsdpkit.ops.plan.failures import FAILURE_CLASSES, PlanInputError
from fsdpkit.ops.plan.layout import parse_replicate
from fsdpkit.ops.plan.model import MECHANISM_TITLES, MECHANISMS
from fsdpkit.ops.plan.planner import (
    DEFAULT_BATCH_TOKENS,
    DEFAULT_MFU,
    DEFAULT_REPLACEMENT_S,
    GPUS_PER_NODE,
    Plan,
    PlanRequest,
    make_plan,
)

NODE_SWEEP = (16, 32, 64, 128, 256, 512, 1024, 2048)


def build_parser() -> OneLineParser:
    p = OneLineParser(
        prog=program("python -m fsdpkit.ops.plan"), description=__doc__.splitlines()[0], allow_abbrev=False
    )
    p.add_argument("--nodes", type=int_arg(lo=1), help="training nodes (default cdk.json gpu.max_nodes)")
    p.add_argument("--spares", type=int_arg(lo=0), help="hot spares (default: the plan's own)")
    p.add_argument(
        "--replicate",
        default="auto",
        metavar="R|auto",
        help="HSDP replicas x shard groups of GPUs / R (1: 1-D FSDP; default auto: the smallest shard group "
        "whose per-GPU memory fits)",
    )
    p.add_argument(
        "--model",
        default="llama3.1-70b",
        help=f"a kit model shape ({', '.join(sorted(MODEL_CONFIGS))}; default llama3.1-70b) or a Hugging "
        "Face model folder (its config.json)",
    )
    p.add_argument("--batch-tokens", type=int_arg(lo=1), default=DEFAULT_BATCH_TOKENS)
    p.add_argument(
        "--mfu", type=float_arg(lo=0.0, hi=1.0, lo_open=True), default=DEFAULT_MFU, help="default 0.4"
    )
    p.add_argument(
        "--price", type=float_arg(lo=0.0, lo_open=True), help="USD per node-hour (default prices.json)"
    )
    p.add_argument(
        "--replacement-s",
        type=float_arg(lo=0.0),
        default=DEFAULT_REPLACEMENT_S,
        help="a lost node's replacement",
    )
    for cls in FAILURE_CLASSES:
        p.add_argument(
            f"--rate-{cls}", type=float_arg(lo=0.0), help=f"{cls} faults per node-hour (default Llama 3)"
        )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument(
        "--png", type=Path, help="also draw goodput against nodes (16 to 2,048), one line per mechanism"
    )
    return p


def plan(argv: list[str] | None = None) -> tuple[Plan, bool, Path | None]:
    args = parse_once(build_parser(), argv)
    if args.png is not None and (problem := output_file_problem(args.png, "--png")):
        raise PlanInputError(problem)
    rates = {cls: getattr(args, f"rate_{cls}") for cls in FAILURE_CLASSES}
    request = PlanRequest(
        nodes=args.nodes, model=args.model, spares=args.spares, batch_tokens=args.batch_tokens, mfu=args.mfu,
        price=args.price, replacement_s=args.replacement_s, replicate=parse_replicate(args.replicate),
        rates={cls: rate for cls, rate in rates.items() if rate is not None},
    )  # fmt: skip
    result = make_plan(request)
    if args.png is not None:
        draw(args.png, result)
    return result, args.json, args.png


def draw(png: Path, result: Plan) -> Path:
    """Goodput against nodes, each size planned as asked (its own layout when `auto`, the same spares)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    job, rates = result.job, result.rates
    replicate = result.request.replicate
    sized = [
        make_plan(dataclasses.replace(
            result.request, nodes=n, spares=job.spares, replicate=replicate if n == job.nodes else "auto"
        ))
        for n in NODE_SWEEP
    ]  # fmt: skip
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for m in MECHANISMS:
        ys = [plan.outcome(m).goodput for plan in sized]
        ax.plot(NODE_SWEEP, ys, marker="o", label=MECHANISM_TITLES[m])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("nodes (8 GPUs each)")
    ax.set_ylabel("expected strict goodput")
    layout = "each size's own layout" if replicate == "auto" else f"replicate {replicate} at {job.nodes}"
    ax.set_title(
        f"{job.checkpoint_gb:,.0f} GB checkpoint, {job.spares} spare(s), {layout}, {rates.source}", fontsize=9
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png


def main(argv: list[str] | None = None) -> int:
    try:
        result, as_json, png = plan(argv)
    except (PlanInputError, ConfigError, CalibrationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    header, job, rates = result.header, result.job, result.rates
    if as_json:
        rows = [{**dataclasses.asdict(o), "title": MECHANISM_TITLES[o.mechanism]} for o in result.outcomes]
        print(json.dumps({**header, "png": None if png is None else str(png), "mechanisms": rows}, indent=2))
        return 0
    print(
        f"{header['nodes']} nodes x {GPUS_PER_NODE} GPUs, {header['model']} "
        f"({header['params'] / 1e9:.1f} B params, "
        f"{job.checkpoint_gb:,.0f} GB a save), step {job.step_s:.1f} s, "
        f"FSx {header['shared_gbps']:.0f} GB/s, "
        f"${header['price_per_node_hour']:.2f}/node-hour, {job.spares} spare(s) "
        f"({header['spares_recommended']} keep the chance of a loss finding none below 1 %); {rates.source}"
    )
    lay = header["layout"]
    print(
        f"layout (every row): {lay['label']}, {lay['source']}; step {job.step_s:.2f} s = max(compute "
        f"{lay['compute_s']:.2f} s, communication {lay['comm_s']['total_s']:.2f} s); 1-D FSDP's step "
        f"{lay['fsdp_1d_step_s']:.2f} s (HSDP / 1-D {lay['hsdp_step_ratio']:.2f})"
    )
    print(
        f"live replica: a lost node gets {lay['node_state_gb']:,.0f} GB from one of {lay['holders']:,} other "
        f"holder(s) at {job.efa_gbps:.0f} GB/s"
        if lay["holders"]
        else "live replica: none (replicate 1): the replica row falls back to the memory tiers"
    )
    print(f"{'mechanism':31} {'goodput':>7} {'interval':>9} {'lost h/day':>10} {'waiting':>8} {'$/day':>11}")
    for o in result.outcomes:
        hours = sum(o.lost_per_day_s.values()) / 3600
        print(
            f"{MECHANISM_TITLES[o.mechanism]:31} {o.goodput:7.3f} {o.interval_s:8.0f}s {hours:10.2f} "
            f"{o.lost_per_day_s['waiting'] / 3600:8.2f} {o.dollars_lost_per_day:11,.0f}"
        )
    print("phase times (s) and rates (GB/s):")
    for name, phase in header["phases"].items():
        print(f"  {name:22} {phase['s']:8.2f}  {phase['source']}")
    for name, rate in header["rates_gbps"].items():
        print(f"  {name + ' GB/s':22} {rate['gbps']:8.2f}  {rate['source']}")
    if png is not None:
        print(f"goodput against nodes: {png}")
    return 0


def entry() -> None:
    """The `kit-plan` console script."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
