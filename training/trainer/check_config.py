"""`python -m fsdpkit.trainer.check_config [--elsewhere] <the trainer's arguments>`: check a config, run
nothing.

Runs the trainer's own loader (`fsdpkit.trainer.config.load_config`) on the arguments the trainer would get,
so the rules and messages are the trainer's: prints the one-line error and exits 78 (as the trainer would), or
prints nothing and exits 0. No process group, no model, no data is touched. `k8s` runs it on the rendered
trainer config before it applies a Job, so `TRAIN.optim.bogus=1` fails at render time, not in a pod.

`--memory WORLD,RANKS_PER_NODE,GPU_MIB,HOST_MIB` also checks the job's memory plan for that world (GPU_MIB
0: CPU ranks sharing HOST_MIB) and prints the plan's line on stdout; a job that will not fit is refused
like a bad value (exit 78), with the fixes that would make it fit.

`--elsewhere` means the config will run on another machine (a pod): the checks that look at this machine
(shard files, the folder of training.dump_final, NVRx or CUDA being available) are neutralised, because
their answer here says nothing about the pod; the trainer runs them again where it starts.
"""

from __future__ import annotations

import sys

from fsdpkit.contracts import exitcodes
from fsdpkit.contracts.cliargs import parse_int

ELSEWHERE = "--elsewhere"

# CLI overrides beat the config file; each one turns a check of this machine into a no-op and cannot
# make a valid config invalid. k8s checks the shapes of these values itself (DATA_PATH under /fsx, ...).
_HOST_NEUTRAL = (
    "--data.kind=synthetic",
    "--data.path=",
    "--model.hf_path=",
    "--training.dump_final=",
    "--inprocess.backend=kit",
    "--checkpoint.backend=kit",
)


MEMORY = "--memory"


def check(argv: list[str]) -> tuple[str | None, str | None]:
    """(error, plan line): error None if the trainer would accept `argv`; plan only with --memory."""
    from fsdpkit.trainer.config import ConfigError, load_config  # after argv handling: --help stays cheap

    elsewhere = ELSEWHERE in argv
    args = [a for a in argv if a != ELSEWHERE]
    memory = None
    if MEMORY in args:
        i = args.index(MEMORY)
        memory, args = args[i + 1 : i + 2], args[:i] + args[i + 2 :]
        try:
            world, ranks, gpu_mib, host_mib = (parse_int(x, MEMORY, lo=0) for x in memory[0].split(","))
        except (IndexError, ValueError):
            return f"{MEMORY} takes WORLD,RANKS_PER_NODE,GPU_MIB,HOST_MIB (whole numbers), got {memory}", None
    if elsewhere:
        args += _HOST_NEUTRAL
    try:
        cfg = load_config(args)
    except ConfigError as exc:
        return " ".join(str(exc).split()), None
    if memory is None:
        return None, None
    from fsdpkit.trainer import memory_plan
    from fsdpkit.trainer.config import model_shape

    shape = model_shape(cfg)
    host = host_mib << 20
    machine = {
        "host_capacity": host, "on_gpu": gpu_mib > 0,
        "device_capacity": (gpu_mib << 20) if gpu_mib else host // max(1, ranks),
    }  # fmt: skip
    try:
        layout = memory_plan.plan_layout(cfg, shape, world=world, ranks_per_node=ranks, **machine)
        line = memory_plan.plan_line(
            cfg, shape, world=world, ranks_per_node=ranks, shard_group=layout.shard, **machine
        )
    except memory_plan.MemoryPlanError as exc:
        return str(exc), None
    return None, line


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return exitcodes.OK
    error, line = check(argv)
    if error is None:
        if line:
            print(line)
        return exitcodes.OK
    print(f"error: {error}", file=sys.stderr)
    return exitcodes.FATAL_CONFIG


def entry() -> None:
    """The `kit-check-config` console script."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
