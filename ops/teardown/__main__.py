"""`python -m fsdpkit.ops.teardown --prefix P`: print what the kit owns and, only when confirmed, delete it
in order.

Dry run by default. Deleting needs `--yes` and the typed confirmation `P/ACCOUNT` (flag or prompt).
Exit codes: 0 ok (dry run, or all deleted), 1 aborted by an AWS error before deleting, 2 bad input or wrong
confirmation (nothing deleted), 3 finished but kept some resources, 4 some deletions failed, 5 nothing tagged
with the prefix, 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys

import botocore.exceptions
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fsdpkit.contracts.cliargs import OneLineParser, float_arg, int_arg
from fsdpkit.ops.aws import Aws, AwsSettings, OpsError, describe_error
from fsdpkit.ops.cli import parse_once
from fsdpkit.ops.tags import PROJECT_TAG, prefix_error
from fsdpkit.ops.teardown import report, runner
from fsdpkit.ops.teardown.model import Options
from fsdpkit.ops.teardown.registry import KIND_NAMES
from fsdpkit.ops.teardown.scope import discover

MAX_STEP_TIMEOUT_S = 86400.0
"""One step may wait at most a day: a longer deadline is a typo (and a huge one overflows the clock)."""
MAX_INTERVAL_S = 3600.0
"""Polls and first backoffs longer than an hour are a typo."""
MAX_ATTEMPTS = 50

seconds = float_arg(lo=0, lo_open=True, hi=MAX_INTERVAL_S)
"""Seconds > 0 and finite: `nan` would sleep forever or crash `time.sleep` mid-deletion."""


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m fsdpkit.ops.teardown",
        allow_abbrev=False,
        description="Delete everything tagged kit:project=PREFIX, in dependency order. Dry run by default.",
        epilog="exit codes: 0 ok/dry run, 1 aborted by an AWS error before deleting, 2 bad input or wrong "
        "confirmation, 3 done but some resources kept, 4 some deletions failed, 5 nothing tagged with "
        "the prefix",
    )
    p.add_argument("--prefix", required=True, help="the kit's name prefix (value of the kit:project tag)")
    p.add_argument("--region", help="AWS region (default: AWS_REGION / the profile's region)")
    p.add_argument("--yes", action="store_true", help="really delete (still needs the typed confirmation)")
    p.add_argument("--confirm", metavar="PREFIX/ACCOUNT", help="the confirmation, typed: prefix/account id")
    p.add_argument(
        "--delete-data",
        action="store_true",
        help="also empty and delete kit-tagged S3 buckets, and delete the EBS volumes a user kept (a PV's "
        "Retain, a claim outside the kit's namespaces, kit:keep-data)",
    )
    p.add_argument(
        "--fsx-backup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="final backup of persistent FSx file systems before deleting them (default: on; "
        "the backups are kept)",
    )
    p.add_argument(
        "--only",
        action="append",
        choices=KIND_NAMES,
        metavar="KIND",
        help=f"only these kinds (repeatable): {', '.join(KIND_NAMES)}",
    )
    p.add_argument(
        "--timeout",
        type=float_arg(lo=0, lo_open=True, hi=MAX_STEP_TIMEOUT_S),
        default=1800.0,
        help=f"seconds per step, > 0 and at most {MAX_STEP_TIMEOUT_S:g} (default 1800)",
    )
    p.add_argument(
        "--poll-interval",
        type=seconds,
        default=10.0,
        help=f"seconds between polls, > 0 and at most {MAX_INTERVAL_S:g} (default 10)",
    )
    p.add_argument(
        "--backoff",
        type=seconds,
        default=5.0,
        help=f"first delay before retrying a dependency error, doubling; > 0, at most {MAX_INTERVAL_S:g} "
        "(default 5)",
    )
    p.add_argument(
        "--retry-mode",
        choices=("standard", "adaptive"),
        default="adaptive",
        help="botocore retry mode for throttling (default adaptive)",
    )
    p.add_argument(
        "--max-attempts",
        type=int_arg(lo=1, hi=MAX_ATTEMPTS),
        default=10,
        help=f"botocore attempts per call, 1..{MAX_ATTEMPTS} (default 10)",
    )
    p.add_argument("--kubectl", default="kubectl", help="kubectl binary for the Kubernetes step")
    p.add_argument("--json", action="store_true", help="print the plan/report as JSON on stdout")
    return p


def confirmed(args: argparse.Namespace, expected: str, err: Console) -> bool:
    typed = args.confirm
    if typed is None:
        if not sys.stdin.isatty():
            raise OpsError(
                f"--yes needs --confirm {expected!r} when not run from a terminal; nothing was deleted"
            )
        typed = err.input(f"Type [bold]{expected}[/] to delete the resources above: ")
    if typed.strip() != expected:
        raise OpsError(f"confirmation {typed.strip()!r} does not match {expected!r}; nothing was deleted")
    return True


def main(argv: list[str] | None = None) -> int:
    args = parse_once(parser(), argv)
    out = Console(soft_wrap=False, width=200 if not sys.stdout.isatty() else None)
    err = Console(stderr=True)
    try:
        if (why := prefix_error(args.prefix)) is not None:
            raise OpsError(why)
        options = Options(
            delete_data=args.delete_data,
            fsx_backup=args.fsx_backup,
            timeout_s=args.timeout,
            poll_s=args.poll_interval,
            backoff_s=args.backoff,
            backoff_max_s=max(args.backoff, 60.0),
            kinds=tuple(args.only or ()),
            kubectl=args.kubectl,
        )
        aws = Aws(AwsSettings(region=args.region, retry_mode=args.retry_mode, max_attempts=args.max_attempts))
        scope = discover(aws, args.prefix, options)
        steps = runner.make_plan(aws, scope)
        if runner.owned_count(steps, scope) == 0 and not any(s.error for s in steps):
            raise NothingFound(
                f"nothing tagged {PROJECT_TAG}={args.prefix} in {scope.region} of account {scope.account} "
                "(already torn down, or a typo in --prefix / --region)"
                + (f" among kinds {', '.join(options.kinds)}" if options.kinds else "")
            )
        if not args.json:
            report.print_plan(out, scope, steps)
        if not args.yes:
            if args.json:
                print(report.as_json(scope, steps, executed=False, code=runner.EXIT_OK))
            else:
                print(
                    f"dry run: nothing changed. To delete, rerun with --yes --confirm "
                    f"'{scope.prefix}/{scope.account}'",
                    file=sys.stderr,
                )
            return runner.EXIT_OK
        confirmed(args, f"{scope.prefix}/{scope.account}", err)
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[note]}"),
            console=err,
        ) as progress:

            def on_step(step: runner.Step) -> runner.strategies.Tick:
                task = progress.add_task(step.kind.title, total=max(len(step.decisions), 1), note=step.note)
                if not step.decisions:
                    progress.update(task, completed=1)

                def tick(finished: int, total: int, note: str) -> None:
                    progress.update(task, completed=finished, note=note)

                return tick

            steps = runner.execute(aws, scope, on_step)
        code = runner.exit_code(steps)
        if args.json:
            print(report.as_json(scope, steps, executed=True, code=code))
        else:
            report.print_results(out, scope, steps)
        return code
    except NothingFound as exc:
        print(f"error: {exc}", file=sys.stderr)
        return runner.EXIT_NOTHING
    except OpsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return runner.EXIT_USAGE
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
        print(
            f"error: AWS call failed, teardown aborted: {describe_error(exc)}; rerun is safe", file=sys.stderr
        )
        return runner.EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted: deletions already started continue in AWS; rerun to finish", file=sys.stderr)
        return 130


class NothingFound(OpsError):
    """The prefix matches nothing in this region/account."""


if __name__ == "__main__":
    sys.exit(main())
