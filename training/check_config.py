"""`python -m training.check_config [--elsewhere] <the trainer's arguments>`: check a config, run nothing.

Runs the trainer's own loader (`training.config.load_config`) on the arguments the trainer would get, so
the rules and messages are the trainer's: prints the one-line error and exits 78 (as the trainer would), or
prints nothing and exits 0. No process group, no model, no data is touched. `k8s` runs it on the rendered
trainer config before it applies a Job, so `TRAIN.optim.bogus=1` fails at render time, not in a pod.

`--elsewhere` means the config will run on another machine (a pod): the checks that look at this machine
(shard files, the folder of training.dump_final, NVRx or CUDA being available) are neutralised, because
their answer here says nothing about the pod; the trainer runs them again where it starts.
"""

from __future__ import annotations

import sys

from training import exitcodes

ELSEWHERE = "--elsewhere"

# CLI overrides beat the config file; each one turns a check of this machine into a no-op and cannot
# make a valid config invalid. k8s checks the shapes of these values itself (DATA_PATH under /fsx, ...).
_HOST_NEUTRAL = (
    "--data.kind=synthetic",
    "--data.path=",
    "--training.dump_final=",
    "--inprocess.backend=kit",
    "--checkpoint.backend=kit",
)


def check(argv: list[str]) -> str | None:
    """None if the trainer would accept `argv`, else its one-line error."""
    from training.config import ConfigError, load_config  # after argv handling: --help stays cheap

    elsewhere = ELSEWHERE in argv
    args = [a for a in argv if a != ELSEWHERE]
    if elsewhere:
        args += _HOST_NEUTRAL
    try:
        load_config(args)
    except ConfigError as exc:
        return " ".join(str(exc).split())
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return exitcodes.OK
    error = check(argv)
    if error is None:
        return exitcodes.OK
    print(f"error: {error}", file=sys.stderr)
    return exitcodes.FATAL_CONFIG


if __name__ == "__main__":
    sys.exit(main())
