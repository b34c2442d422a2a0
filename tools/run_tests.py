"""`make test`: the slow tests one at a time, every other test beside them at a lower CPU priority.

The tests marked slow run real multi-process training whose timeouts are learned from real step times, so
they run alone, in the foreground, as they always did. The other tests (one process each, nothing timed)
run at the same time on every core (pytest-xdist) under `nice`: the kernel gives them mostly the CPU the
slow tests leave idle (a third of it on 2 cores: they wait on timeouts, restarts and each other), so the
whole suite takes little more than the slow tests alone. Their output is printed when both are done; the
exit status is the first failure's (slow tests first), 0 when both passed.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from fsdpkit.contracts.cliargs import OneLineParser, int_arg

REPO = Path(__file__).resolve().parents[1]


_whole_number = int_arg(lo=1, hi=512)


def _workers(text: str) -> str:
    """pytest-xdist's -n: a number of workers, or auto (one per core)."""
    if text == "auto":
        return text
    try:
        return str(_whole_number(text))
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, or auto (one per core)") from None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m tools.run_tests", description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=_workers, default="auto", help="xdist workers for the other tests")
    parser.add_argument("--nice", type=int_arg(lo=0, hi=19), default=10, help="their niceness (default 10)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    pytest = [sys.executable, "-m", "pytest"]
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as log:
        beside = subprocess.Popen(
            ["nice", "-n", str(args.nice), *pytest, "-m", "not slow", "-n", args.workers],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            slow = subprocess.run([*pytest, "-m", "slow"], cwd=REPO).returncode
            others = beside.wait()
        finally:
            if beside.poll() is None:  # interrupted: stop the background session and its workers too
                os.killpg(beside.pid, signal.SIGTERM)
                beside.wait()
        log.seek(0)
        print(f"\n==== the tests not marked slow (beside the slow ones, nice {args.nice}) ====", flush=True)
        sys.stdout.write(log.read())
    return slow or others


if __name__ == "__main__":
    sys.exit(main())
