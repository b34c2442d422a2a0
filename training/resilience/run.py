"""`run`: one training process's whole life under the resilience layer (public API).

Checks that need no process group first (a checkpoint of another world size that cannot be resharded,
the fault plan in the config), then the process group (and the EFA check on p5), then the script's
`build`, the resume, its `train`, in-process restarts around it, the final save and the exit code:
  0   done (the final step committed);
  78  bad config or no verifiable checkpoint where some were committed (one line on stderr; never retried);
  143 drained (SIGTERM on some rank: the job saved and committed the agreed step first).
Anything else is a real failure: the exception propagates, and torchelastic's `@record` writes it for the
launcher (atomically: fsdpkit.runtime.error_file), which restarts the worker group.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from fsdpkit.contracts import env, exitcodes
from fsdpkit.resilience.checkpoint.layout import checkpoints_dir
from fsdpkit.resilience.checkpoint.reshard import ReshardPolicy
from fsdpkit.resilience.checkpoint.resume import CheckpointError, check_world_size
from fsdpkit.resilience.config import ConfigError
from fsdpkit.resilience.inprocess import Build, Train, run_under_nvrx, run_with_restarts
from fsdpkit.resilience.job import Job
from fsdpkit.resilience.parallel import layout_from_env
from fsdpkit.runtime import efa
from fsdpkit.runtime import torch_internals as internals
from fsdpkit.runtime.distributed import DistContext, init_distributed, set_deterministic, shutdown
from fsdpkit.runtime.error_file import AtomicErrorHandler

if TYPE_CHECKING:
    from fsdpkit.resilience.config import ResilienceConfig
    from fsdpkit.resilience.session import Session


def run(
    cfg: ResilienceConfig,
    *,
    build: Build,
    train: Train,
    on_finish: Callable[[Job, Session], None] | None = None,
    start_fields: dict[str, Any] | None = None,
    on_job: Callable[[Job], None] | None = None,
) -> int:
    """Train with the kit's guarantees; returns the process's exit code (see the module docstring).

    `build(job, *, init_weights) -> Session` makes the model, optimizer, schedule and data on `job.ctx`;
    `train(job, session)` runs the loop, one `with job.step(session)` per step. `on_finish(job, session)`
    runs on every rank after the final step is committed (e.g. export the model); `start_fields` go into
    the `start` event; `on_job(job)` sees the Job before the first build (e.g. set `job.step_fields`)."""
    try:
        return _recorded(cfg, build, train, on_finish, start_fields or {}, on_job)
    except SystemExit as exc:  # a drain leaves from deep in the loop: returned, as the docstring says
        if exc.code == exitcodes.DRAINED:
            return exitcodes.DRAINED
        raise


@functools.partial(record, error_handler=AtomicErrorHandler())
def _recorded(
    cfg: ResilienceConfig,
    build: Build,
    train: Train,
    on_finish: Callable[[Job, Session], None] | None,
    start_fields: dict[str, Any],
    on_job: Callable[[Job], None] | None,
) -> int:
    problem = internals.check()
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return exitcodes.FATAL_CONFIG
    try:
        if cfg.checkpoint.mode != "off":  # a checkpoint of another world size that cannot be resharded:
            check_world_size(  # refused before any group
                checkpoints_dir(cfg.run.run_dir),
                int(os.environ.get("WORLD_SIZE", "1")),
                ReshardPolicy(global_batch=cfg.training.global_batch or None),
            )
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exitcodes.FATAL_CONFIG
    set_deterministic(cfg.training.deterministic)
    job = Job(cfg)
    if on_job is not None:
        on_job(job)

    def finish(session: Session) -> None:
        job.finish(session, after_save=(lambda: on_finish(job, session)) if on_finish else None)

    try:
        if cfg.inprocess.enabled and cfg.inprocess.backend == "nvrx":
            job.emit_start(**start_fields)
            job.heartbeat.phase("start")
            return run_under_nvrx(job, build, train, finish)
        if cfg.training.efa_devices:
            efa.prepare_nccl_log()
        layout = layout_from_env(cfg.parallel, os.environ)
        job.ctx = init_distributed(
            timeout_s=cfg.training.collective_timeout_s, replicate=layout.replicate,
            join=cfg.inprocess.enabled and bool(os.environ.get(env.REJOIN)),
        )  # fmt: skip
        problem = verify_fabric(cfg.training.efa_devices, job.ctx)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return exitcodes.FATAL_CONFIG
        job.emit_start(**start_fields)
        job.heartbeat.phase("start")
        session = run_with_restarts(job, build, train)
        finish(session)
        session.checkpointer.close()
        return exitcodes.OK
    except (CheckpointError, ConfigError, internals.TorchInternalsChanged) as exc:  # e.g. checkpoints exist
        # but none verifies: never step 0; or torch built an object without an attribute the kit needs
        print(f"error: {exc}", file=sys.stderr)
        return exitcodes.FATAL_CONFIG
    finally:
        job.close()
        shutdown()


def verify_fabric(expected: int, ctx: DistContext) -> str | None:
    """None when this job trains over EFA as its profile expects (or expects nothing); else the reason.

    A first collective makes NCCL choose its network; local rank 0 of each node then checks fi_info and
    NCCL's log, and an all-reduce tells every rank of every node, so the whole job exits 78 together
    instead of training over TCP sockets."""
    if not expected:
        return None
    if ctx.world_size > 1:
        dist.barrier()
    problem = None
    if ctx.local_rank == 0:
        try:
            efa.check_fabric(expected)
            if ctx.backend == "nccl":
                efa.check_nccl_log(efa.nccl_log_path(), expected)
        except efa.EfaError as exc:
            problem = str(exc)
    verdict = torch.tensor([0 if problem else 1], device=ctx.device)
    if ctx.world_size > 1:
        dist.all_reduce(verdict, op=dist.ReduceOp.MIN)
    if problem or int(verdict.item()) == 1:
        return problem
    return "the EFA check failed on another node (its log says why); training.efa_devices=0 skips it"
