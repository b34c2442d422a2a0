"""In-process restart: recover from a Python exception or a collective timeout without new processes.

Kit backend (`inprocess.backend=kit`), per fault (an exception, a collective that fails, or a hang the
launcher interrupts: fsdpkit.runtime.hang_interrupt):
  1. abort every process group of this process: its connections close, so a peer blocked in a
     collective with this rank fails at once (gloo has no remote abort; without this the peer would wait
     for the collective timeout); abandon the in-flight checkpoint save (it stops at its next phase and
     never commits, see fsdpkit.resilience.checkpoint.guard) and wait for it to stop; drop the model,
     optimizer and checkpointer groups;
  2. meet every rank at a barrier on a separate TCPStore (hosted by rank 0 on its own port, a fresh key
     prefix per restart generation), at most `barrier_timeout_s`;
  3. create a new default process group on a fresh key prefix, rebuild model, optimizer and checkpointer;
  4. restore, agreed in one all-gather over the new group (every rank reports its live step and its
     host-memory step, so no rank resumes from a state its peers did not agree to):
     live       every rank's live state is clean at the same step (resilience.state: the exception came
                before the step's optimizer update, or between steps): copy the failed session's own
                tensors into the new one; no step is computed again. If the last save due by then never
                committed (the restart abandoned it), that step is saved again at once;
     memory     else, if every rank's checkpointer holds the same step in host memory (`memory_step()`),
                copy it back (no disk read);
     checkpoint else the newest committed step, from the memory tiers when every rank's copy is on a
                node of the job, else from shared storage; with no checkpoint at all (none), start again
                from the seed (the same weights as the first start);
  5. continue the loop.
A rank that cannot recover this way (a peer never reaches the barrier: it died or hangs in C code; the
restart budget is spent; the restart itself fails) raises, and the process exits non-zero so the launcher
restarts the whole group. Each restart emits `inprocess_restart` (its `source`, and `why` when it is not
live) and `resume` events.

NVRx backend (`inprocess.backend=nvrx`): the same loop runs inside nvidia_resiliency_ext's
`inprocess.Wrapper` (store and group created per Wrapper iteration, as its docs require).

Both take the script's `build(job, *, init_weights) -> Session` and `train(job, session)`: nothing here
knows a model or a loop (public API: fsdpkit.resilience.run).
"""

from __future__ import annotations

import gc
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

import torch.distributed as dist

from fsdpkit.contracts import env
from fsdpkit.resilience.checkpoint.resume import one_line
from fsdpkit.resilience.recovery import (
    Build,
    Plan,
    build_session,
    capture_live,
    close_quietly,
    plan_restore,
    require_ctx,
    restore,
)
from fsdpkit.resilience.restart_store import RestartFailed, RestartStore
from fsdpkit.resilience.state import rng_state
from fsdpkit.runtime import hang_interrupt
from fsdpkit.runtime.distributed import abort_groups, new_group

if TYPE_CHECKING:
    from fsdpkit.resilience.config import InprocessConfig
    from fsdpkit.resilience.job import Job
    from fsdpkit.resilience.session import Session


__all__ = ["Build", "RestartFailed", "Train", "run_under_nvrx", "run_with_restarts"]

Train = Callable[["Job", "Session"], None]
"""The script's loop: trains `session` up to the job's last step, one `job.step(session)` per step."""


def run_with_restarts(job: Job, build: Build, train: Train) -> Session:
    """Build, resume and train; with in-process restart enabled, recover soft faults in place."""
    cfg: InprocessConfig = job.cfg.inprocess
    ctx, events = require_ctx(job), job.events
    if cfg.enabled:
        # What is alive now (modules, config, the job) outlives every restart: the full collection
        # that frees a failed session then scans only what came after (0.3 s -> ms on the test machine).
        gc.freeze()
    if cfg.enabled and os.environ.get(env.REJOIN):
        store = RestartStore(ctx, cfg.barrier_timeout_s)
        session = rejoin(job, build, store)
    else:
        session = build_session(job, build)
        job.resume(session)
        if not cfg.enabled:
            train(job, session)
            return session
        store = RestartStore(ctx, cfg.barrier_timeout_s)
    restarts = 0
    while (reason := _train_until_fault(job, session, train)) is not None:
        t_fail = time.time()
        if restarts >= cfg.max_restarts:
            raise RestartFailed(
                f"rank {ctx.rank}: in-process restart budget ({cfg.max_restarts}) spent; last: {reason}"
            )
        restarts += 1
        print(
            f"[inprocess] rank {ctx.rank}: {reason}; restart {restarts}/{cfg.max_restarts}",
            file=sys.stderr,
            flush=True,
        )
        # Drop every reference to the failed group (model, optimizer, FSDP state) and abort it: its sockets
        # close, so a peer blocked in a collective with this rank fails now rather than at the timeout.
        # Then the in-flight save is abandoned: it stops at its next phase (never on without its group, nor
        # on the next one), and whatever it still tries on the aborted group fails at once. Abandoning it
        # before the abort would let it start a collective that the abort then races with.
        job.heartbeat.phase("load")  # the load allowance from here: abort, settle, barrier, rebuild
        previous = session.checkpointer
        abort_groups(ctx)
        live = capture_live(session)
        own_rng = rng_state()  # before the rebuild seeds it: a replica restore keeps this rank's own RNG
        portable = session.state.reshard_problem() is None
        session = None
        previous.abandon()
        if not previous.settle(cfg.barrier_timeout_s, give_up=lambda: job.drain.requested):
            if job.drain.requested:  # the launcher is stopping this worker (its group re-forms): go now
                raise RestartFailed(
                    f"rank {ctx.rank}: asked to stop (SIGTERM) while its abandoned save was still running"
                )
            print(f"[inprocess] rank {ctx.rank}: the abandoned save runs on", file=sys.stderr, flush=True)
        gc.collect()  # the failed session's cycles (FSDP state, hooks): the frozen imports are not scanned
        store.announce(ctx.generation + 1)  # for a peer its launcher starts again in place (`rejoin`)
        store.barrier(ctx.generation + 1, give_up=lambda: job.drain.requested)
        new_group(ctx, ctx.generation + 1)
        plan = plan_restore(job, previous, live, portable=portable)
        # Restored from live state (its own or a replica's) or the host copy: the seeded init would be
        # overwritten. From disk it stays: a checkpoint that turns out unreadable falls back to the seed.
        seeded = plan.source == "checkpoint"
        resumes_live = plan.source in ("live", "replica")  # nothing rolled back: no fault for `interval=auto`
        session = build_session(job, build, init_weights=seeded, live=resumes_live)
        step, source, why = restore(job, session, previous, live, plan, seeded=seeded, own_rng=own_rng)
        if resumes_live and step is not None:
            job.complete_step(session, step, failed_at=t_fail)
        close_quietly(previous)
        previous = live = own_rng = None
        duration = time.time() - t_fail
        events.emit(
            "inprocess_restart", reason=reason, restored_step=step, source=source, duration_s=duration,
            why=why,
        )  # fmt: skip
        if source == "none" and job.cfg.checkpoint.mode == "off":  # else the checkpointer emitted it
            events.emit("resume", step=None, source="none", duration_s=duration, fallback_from=None)
        because = f" ({why})" if why else ""
        job.log(
            f"in-process restart {restarts}: restored step {step} from {_job_source(plan, source)}{because} "
            f"in {duration:.2f} s"
        )
        job.heartbeat.phase("train")
    return session


def rejoin(job: Job, build: Build, store: RestartStore) -> Session:
    """A worker its launcher started again in place (`--rank-restart in-place`, after a crash): join the
    in-process restart its peers are in, then restore as they agreed: its shard from a live replica when
    one completed the step (only the interrupted step is computed again), else the memory tiers or shared
    storage with every rank. It has no live state, no host copy and no RNG of its own: its RNG is the one
    its start seeds (a script that draws random numbers inside steps is then not bitwise reproducible)."""
    ctx, cfg, t0 = require_ctx(job), job.cfg.inprocess, time.time()
    job.heartbeat.phase("load")
    generation = store.joinable(cfg.barrier_timeout_s)
    store.barrier(generation, give_up=lambda: job.drain.requested)
    new_group(ctx, generation)
    lost = (None, "restarted in place (its worker died)", None)
    plan = plan_restore(job, None, lost, portable=True)
    session = build_session(job, build, live=plan.source in ("live", "replica"))
    step, source, why = restore(job, session, None, lost, plan, seeded=True)
    job.events.emit(
        "inprocess_restart", reason=f"rejoined in place ({os.environ.get(env.REJOIN)})", restored_step=step,
        source=source, duration_s=time.time() - t0, why=why,
    )  # fmt: skip
    job.heartbeat.phase("train")
    return session


def _job_source(plan: Plan, own: str) -> str:
    """What the job restored from, as rank 0 says it: a replica plan names its transfers."""
    if plan.source != "replica" or plan.replica is None:
        return own
    pairs = ", ".join(f"rank {r} from rank {s}" for r, s in plan.replica.senders[:8])
    return f"live replicas ({pairs})"


def _train_until_fault(job: Job, session: Session, train: Train) -> str | None:
    """Run the loop (the launcher may interrupt a hang in it); on an Exception return its one-line reason.
    Returning (not raising) frees the traceback's frames, which hold the model and so the failed group."""
    try:
        with hang_interrupt.armed(job.heartbeat):
            train(job, session)
    except Exception as exc:  # BaseException (KeyboardInterrupt, SystemExit) is never caught
        traceback.print_exc(file=sys.stderr)
        return one_line(exc)
    return None


class _PingingHeartbeat:
    """The kit heartbeat plus NVRx's progress ping, so the Wrapper's soft timeout sees every step."""

    def __init__(self, heartbeat: object, call_wrapper: object) -> None:
        self._heartbeat, self._call_wrapper = heartbeat, call_wrapper

    def beat(self, step: int) -> None:
        self._heartbeat.beat(step)  # type: ignore[attr-defined]
        self._call_wrapper.ping()  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._heartbeat, name)


def nvrx_timeouts(cfg: InprocessConfig, collective_timeout_s: float) -> dict[str, timedelta]:
    """Wrapper timeouts derived from ours, within its rules: soft < hard < barrier, heartbeat < barrier."""
    barrier = cfg.barrier_timeout_s
    soft = min(collective_timeout_s, 0.5 * barrier)
    return {
        "soft_timeout": timedelta(seconds=soft),
        "hard_timeout": timedelta(seconds=max(soft + 1, 0.75 * barrier)),
        "heartbeat_timeout": timedelta(seconds=0.5 * barrier),
        "barrier_timeout": timedelta(seconds=barrier),
        "completion_timeout": timedelta(seconds=barrier),
    }


def run_under_nvrx(job: Job, build: Build, train: Train, finish: Callable[[Session], None]) -> int:
    """Run the script inside NVRx's `inprocess.Wrapper` (reference: torch-on-cpu.md §5.3).

    The Wrapper owns its store on MASTER_PORT+2; each iteration builds a multi-tenant TCPStore on
    MASTER_PORT+1 and a process group on a per-iteration prefix, rebuilds the session and restores from
    the previous iteration's host copy (all ranks agreeing) or from disk; `finish(session)` ends the last
    one. Its abort only destroys gloo groups, so a peer's recovery is bounded by the collective timeout
    (training.collective_timeout_s).
    """
    from nvidia_resiliency_ext import inprocess

    from fsdpkit.resilience.parallel import layout_from_env
    from fsdpkit.runtime.distributed import init_distributed, wait_for_listener

    cfg = job.cfg
    port = int(os.environ.get("MASTER_PORT", "29500"))
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    kept: dict[str, object] = {}
    heartbeat = job.heartbeat

    def iteration_fn(call_wrapper: inprocess.CallWrapper = None) -> int:  # type: ignore[assignment]
        t0 = time.time()
        iteration = call_wrapper.iteration
        if (stale := kept.get("checkpointer")) is not None:
            stale.abandon()  # type: ignore[attr-defined]  # before a new group exists for it to run on
        timeout_s = cfg.inprocess.barrier_timeout_s
        if rank != 0:  # in Python, not in torch's C connect loop, so NVRx's progress watchdog sees it alive
            wait_for_listener(host, port + 1, deadline=time.monotonic() + timeout_s)
        store = dist.TCPStore(
            host, port + 1, world_size=world, is_master=rank == 0, multi_tenant=True, wait_for_workers=False,
            timeout=timedelta(seconds=timeout_s),
        )  # fmt: skip
        job.ctx = init_distributed(
            timeout_s=cfg.training.collective_timeout_s, store=store, generation=iteration,
            replicate=layout_from_env(cfg.parallel, os.environ).replicate,
        )  # fmt: skip
        session = build_session(job, build)
        previous = kept.pop("checkpointer", None)
        kept["checkpointer"] = session.checkpointer
        if iteration == 0:
            job.resume(session)
        else:
            step, source, why = restore(job, session, previous)
            if previous is not None:
                close_quietly(previous)
            job.events.emit(
                "inprocess_restart", reason="nvrx wrapper restart", restored_step=step, source=source,
                duration_s=time.time() - t0, iteration=iteration, why=why,
            )  # fmt: skip
        job.heartbeat = _PingingHeartbeat(heartbeat, call_wrapper)  # type: ignore[assignment]
        try:
            train(job, session)
        finally:
            job.heartbeat = heartbeat
        finish(session)
        session.checkpointer.close()
        dist.destroy_process_group()
        return 0

    # The Wrapper injects CallWrapper by annotation; this module's annotations are strings (PEP 563).
    iteration_fn.__annotations__["call_wrapper"] = inprocess.CallWrapper
    wrapped = inprocess.Wrapper(
        store_kwargs={"host_name": host, "port": port + 2},
        initialize=inprocess.initialize.RetryController(max_iterations=cfg.inprocess.max_restarts + 1),
        health_check=None,
        **nvrx_timeouts(cfg.inprocess, cfg.training.collective_timeout_s),
    )(iteration_fn)
    return int(wrapped())
