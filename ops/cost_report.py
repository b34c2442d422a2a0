"""`python -m fsdpkit.ops.cost_report --prefix P`: what the kit spent, what it burns now, and what faults
cost.

Sections: spend (Cost Explorer, by service and by stack, for --period), burn rate (running kit instances x
on-demand price, plus FSx and EBS storage), and, with --run-dir, the cost of checkpoint stalls, recovery
and rework of one training run. --offline skips AWS (only the run section, static prices).
Exit codes: 0 ok, 1 an AWS call failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
from pathlib import Path

import botocore.exceptions
from rich.console import Console

from fsdpkit.contracts.cliargs import OneLineParser, float_arg, output_file_problem
from fsdpkit.ops.aws import Aws, AwsSettings, OpsError, describe_error
from fsdpkit.ops.cli import parse_once
from fsdpkit.ops.cost import prices
from fsdpkit.ops.cost.burn import get_burn
from fsdpkit.ops.cost.faults import fault_cost, load_metrics
from fsdpkit.ops.cost.render import CostReport, to_csv, to_json, to_markdown, to_png, to_table
from fsdpkit.ops.cost.spend import get_spend
from fsdpkit.ops.tags import prefix_error

DEFAULT_INSTANCE = "p5.48xlarge"
MAX_GPU_HOUR_USD = 1000.0
"""A GPU-hour above $1,000 is a typo (an H100 costs about $7 on demand)."""


def parse_period(text: str, today: dt.date) -> tuple[dt.date, dt.date]:
    """`30d` (the last 30 days up to today, exclusive) or `START:END` (ISO dates, END exclusive)."""
    m = re.fullmatch(r"(\d{1,3})d", text)
    if m:
        days = int(m.group(1))
        if not 1 <= days <= 365:
            raise OpsError(f"--period {text!r}: days must be 1..365 (Cost Explorer keeps 13 months)")
        return today - dt.timedelta(days=days), today
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        start, end = dt.date.fromisoformat(parts[0]), dt.date.fromisoformat(parts[1])
    except ValueError:
        raise OpsError(f"--period {text!r}: use 30d or START:END as YYYY-MM-DD:YYYY-MM-DD") from None
    if start >= end:
        raise OpsError(f"--period {text!r}: START must be before END (END is exclusive)")
    return start, end


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m fsdpkit.ops.cost_report", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    p.add_argument("--prefix", required=True, help="the kit's name prefix (value of the kit:project tag)")
    p.add_argument("--region", help="AWS region of the kit (default: AWS_REGION / the profile's region)")
    p.add_argument(
        "--period", default="30d", help="30d (last N days) or START:END (ISO dates, END exclusive)"
    )
    p.add_argument("--run-dir", type=Path, help="a run folder (<run.root>/<run.id>) for the fault/stall cost")
    p.add_argument("--format", choices=("table", "md", "csv", "json"), default="table", help="output format")
    p.add_argument("--png", type=Path, help="also write a PNG chart here")
    p.add_argument(
        "--instance-type",
        default=DEFAULT_INSTANCE,
        help=f"GPU instance the run used, to price a GPU-hour (default {DEFAULT_INSTANCE})",
    )
    p.add_argument(
        "--gpu-hour-price",
        type=float_arg(lo=0, lo_open=True, hi=MAX_GPU_HOUR_USD),
        help=f"USD per GPU-hour (> 0, at most {MAX_GPU_HOUR_USD:g}), instead of looking it up",
    )
    p.add_argument("--offline", action="store_true", help="no AWS calls: only the run section, static prices")
    p.add_argument(
        "--skip",
        action="append",
        choices=("spend", "burn"),
        default=[],
        help="skip a section (spend costs $0.01 per Cost Explorer request)",
    )
    return p


def gpu_hour_price(args: argparse.Namespace, aws: Aws | None, region: str) -> tuple[float, str]:
    if args.gpu_hour_price is not None:
        return args.gpu_hour_price, "--gpu-hour-price"
    p = prices.ec2_hourly(aws, args.instance_type, region)
    gpus = prices.gpus_per_instance(aws, args.instance_type)
    if p.usd is None or not gpus:
        raise OpsError(
            f"no price for {args.instance_type} in {region} (Pricing API and ops/prices.json); "
            "pass --gpu-hour-price USD"
        )
    return p.usd / gpus, f"{args.instance_type} {p.usd:g} USD/h / {gpus} GPUs, {p.source}"


def main(argv: list[str] | None = None) -> int:
    args = parse_once(parser(), argv)
    try:
        if (why := prefix_error(args.prefix)) is not None:
            raise OpsError(why)
        if args.png is not None and args.png.suffix != ".png":
            raise OpsError(f"--png {str(args.png)!r}: must end in .png")
        if args.png is not None and (problem := output_file_problem(args.png, "--png")):
            raise OpsError(problem)
        if args.offline and args.run_dir is None:
            raise OpsError("--offline reports only a run's cost: pass --run-dir DIR")
        start, end = parse_period(args.period, dt.datetime.now(dt.UTC).date())
        metrics = load_metrics(args.run_dir) if args.run_dir is not None else None
        aws = None if args.offline else Aws(AwsSettings(region=args.region))
        region = aws.region if aws else (args.region or "us-east-1")
        report = CostReport(prefix=args.prefix, region=region, account=aws.account_id() if aws else "offline")
        if aws is not None and "spend" not in args.skip:
            report.spend = get_spend(aws, args.prefix, start, end)
        if aws is not None and "burn" not in args.skip:
            report.burn = get_burn(aws, args.prefix)
        if metrics is not None:
            price, source = gpu_hour_price(args, aws, region)
            report.faults = fault_cost(metrics, price, source)
        if args.format == "table":
            to_table(report, Console())
        else:
            render = {"md": to_markdown, "csv": to_csv, "json": to_json}[args.format]
            sys.stdout.write(render(report) + ("" if args.format != "json" else "\n"))
        if args.png is not None:
            to_png(report, args.png)
        return 0
    except OpsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
        print(f"error: AWS call failed: {describe_error(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
