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
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, NoReturn, Protocol

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from fsdpkit.resilience import replica
from fsdpkit.resilience.checkpoint.layout import checkpoints_dir, is_committed, list_steps
from fsdpkit.resilience.checkpoint.resume import one_line
from fsdpkit.resilience.checkpoint.staging import flatten_state, restore_into
from fsdpkit.resilience.replica import ReplicaPlan
from fsdpkit.resilience.state import rng_state
from fsdpkit.runtime import hang_interrupt
from fsdpkit.runtime.distributed import abort_groups, new_group, seed_everything, serve_store
from fsdpkit.runtime.run_token import run_key

if TYPE_CHECKING:
    from fsdpkit.resilience.config import InprocessConfig
    from fsdpkit.resilience.job import Job
    from fsdpkit.resilience.session import Session
    from fsdpkit.runtime.distributed import DistContext


class Build(Protocol):
    """The script's builder: a fresh Session on `job.ctx` (seeded init, or values left as allocated when
    `init_weights` is False because every value is restored at once)."""

    def __call__(self, job: Job, *, init_weights: bool) -> Session: ...


Train = Callable[["Job", "Session"], None]
"""The script's loop: trains `session` up to the job's last step, one `job.step(session)` per step."""


class RestartFailed(RuntimeError):
    """This rank cannot recover in process; the launcher must restart the group."""


BARRIER_POLL = timedelta(seconds=0.1)
"""How often a rank waiting in the restart barrier looks at whether it was asked to stop."""


class RestartStore:
    """The barrier's own TCPStore: rank 0 hosts it on a free port published through the job store (sealed
    with the run's key: a port a client without the run's token wrote is refused)."""

    def __init__(self, ctx: DistContext, timeout_s: float) -> None:
        self.ctx = ctx
        self.timeout = timedelta(seconds=timeout_s)
        key = f"{run_key().scoped('kit/', 'inprocess')}{ctx.store_scope}/inprocess_store_port"
        host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        assert ctx.store is not None
        if ctx.rank == 0:
            self.store = serve_store(host, 0, world_size=ctx.world_size, timeout=self.timeout)
            ctx.store.set(key, run_key().seal(key, str(self.store.port)))
            if ctx.world_size > 1:  # stay until every rank is connected: a run with nothing left to train
                ctx.store.wait([f"{key}/all"], self.timeout)  # would otherwise end and take the store along
        else:
            port = run_key().open(key, ctx.store.get(key).decode(errors="replace"))
            if port is None:
                raise RestartFailed(
                    f"the in-process store's port at {key} is not the run's (forged); refused"
                )
            self.store = dist.TCPStore(
                host, int(port), world_size=ctx.world_size, is_master=False, timeout=self.timeout
            )
            if ctx.store.add(f"{key}/joined", 1) == ctx.world_size - 1:
                ctx.store.set(f"{key}/all", "1")

    def barrier(self, generation: int, give_up: Callable[[], bool] = lambda: False) -> None:
        """Every rank arrives at `generation`'s barrier, or RestartFailed after the timeout, or at once when
        `give_up()` turns true (the launcher stops this worker: its group re-forms without the barrier)."""
        prefix = f"{run_key().scoped('', 'inprocess')}{self.ctx.store_scope}/gen{generation}"
        arrived = self.store.add(f"{prefix}/arrived", 1)
        if arrived == self.ctx.world_size:
            self.store.set(f"{prefix}/go", "1")
        deadline = time.monotonic() + self.timeout.total_seconds()
        while True:
            try:
                self.store.wait([f"{prefix}/go"], BARRIER_POLL)
                return
            except dist.DistStoreError as exc:  # this slice timed out (a lost store is a DistNetworkError)
                if time.monotonic() >= deadline:
                    self._failed(prefix, generation, exc)
            except (RuntimeError, dist.DistError) as exc:
                self._failed(prefix, generation, exc)
            if give_up():
                raise RestartFailed(
                    f"rank {self.ctx.rank}: asked to stop (SIGTERM) while waiting in in-process restart "
                    f"barrier {generation}"
                )

    def _failed(self, prefix: str, generation: int, exc: BaseException) -> NoReturn:
        """RestartFailed, saying how many ranks reached the barrier."""
        arrived = self.store.add(f"{prefix}/arrived", 0)
        raise RestartFailed(
            f"rank {self.ctx.rank}: only {arrived}/{self.ctx.world_size} ranks reached in-process "
            f"restart barrier {generation} within {self.timeout.total_seconds():.0f} s "
            f"(a peer died or hangs); exiting so the launcher restarts the group"
        ) from exc


@dataclass(frozen=True)
class Report:
    """What one rank brings to the restore agreement."""

    live: int | None
    """The step its live state is cleanly at; None when it is torn (or was not captured)."""
    why: str | None
    """Why `live` is None."""
    memory: int | None
    """The step its checkpointer holds in host memory; None if none."""
    committed: int | None = None
    """Rank 0 only: the newest committed step on disk (for the re-save after a live resume)."""
    portable: bool = True
    """Its state has no per-rank part, so a replica's state can restore it (fsdpkit.resilience.replica)."""


REPORT_FIELDS: dict[str, type] = {
    "live": int, "why": str, "memory": int, "committed": int, "portable": bool,
}  # fmt: skip
"""A report's fields and their type (each may also be None): what `report_from_json` accepts, nothing else."""


def report_to_json(report: Report) -> bytes:
    return json.dumps(
        {name: getattr(report, name) for name in REPORT_FIELDS}, sort_keys=True, separators=(",", ":")
    ).encode()


def report_from_json(data: bytes) -> Report:
    """A peer's report from its JSON bytes: exactly the fields of a Report, each of its type or null (a
    peer's bytes are never unpickled). ValueError naming what is wrong."""
    obj = json.loads(data.decode("utf-8"))
    if not isinstance(obj, dict) or set(obj) != set(REPORT_FIELDS):
        raise ValueError(f"not a restore report: {data[:200]!r}")
    for name, kind in REPORT_FIELDS.items():
        value = obj[name]
        if value is not None and (type(value) is not kind):  # bool is not an int here
            raise ValueError(f"restore report field {name!r} is {value!r}, not {kind.__name__} or null")
    return Report(**obj)


def exchange_reports(mine: Report) -> list[Report]:
    """Every rank's report, in rank order, over the current group as JSON in uint8 tensors (lengths first,
    then the padded bytes): `all_gather_object` would unpickle what a peer sends."""
    data = report_to_json(mine)
    world = dist.get_world_size()
    lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(lengths, torch.tensor([len(data)], dtype=torch.int64))
    size = max(int(n.item()) for n in lengths)
    mine_t = torch.zeros(size, dtype=torch.uint8)
    mine_t[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    gathered = [torch.zeros(size, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(gathered, mine_t)
    reports = []
    for rank, (n, t) in enumerate(zip(lengths, gathered, strict=True)):
        try:
            reports.append(report_from_json(t[: int(n.item())].numpy().tobytes()))
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise RestartFailed(f"rank {rank}'s restore report is refused: {one_line(exc)}") from None
    return reports


@dataclass(frozen=True)
class Plan:
    """The restore every rank takes: the same on every rank (computed from the same reports)."""

    source: Literal["live", "replica", "memory", "checkpoint"]
    step: int | None
    """The live, replica or host-memory step; None for the checkpoint (memory tiers, then shared storage)."""
    why: str | None
    """Why not live (None when live)."""
    resave: bool = False
    """Live or replica: the last save due by `step` never committed, so save `step` at once."""
    replica: ReplicaPlan | None = None
    """Replica only: who sends to whom."""


def agree(reports: list[Report], *, interval: int | None, replicate: int = 1) -> Plan:
    """Live if every rank is clean at the same step; else, with HSDP, from live replicas (replica.plan);
    else the host copy if every rank holds the same step; else disk. `interval`: the fixed checkpoint
    interval (None: off or auto), for the re-save."""
    lives = {r.live for r in reports}
    committed = reports[0].committed
    if len(lives) == 1 and None not in lives:
        step = reports[0].live
        assert step is not None
        return Plan("live", step, None, resave=_resave(step, interval, committed))
    torn = [f"rank {rank}: {r.why}" for rank, r in enumerate(reports) if r.live is None]
    why = "; ".join(torn) if torn else f"ranks stopped at different steps {[r.live for r in reports]}"
    from_replicas = replica.plan(
        [r.live for r in reports], [r.portable for r in reports], replicate=replicate
    )
    if isinstance(from_replicas, ReplicaPlan):
        step = from_replicas.step
        return Plan("replica", step, why, _resave(step, interval, committed), from_replicas)
    if replicate > 1:
        why = f"{why}; {from_replicas}"
    memory = {r.memory for r in reports}
    if len(memory) == 1 and None not in memory:
        return Plan("memory", reports[0].memory, why)
    return Plan("checkpoint", None, why)


def _resave(step: int, interval: int | None, committed: int | None) -> bool:
    """The last save due by `step` never committed (the fault abandoned it)."""
    due = step - step % interval if interval else 0
    return due > 0 and (committed is None or committed < due)


def capture_live(session: Session) -> tuple[int | None, str | None, dict[str, Any] | None]:
    """(step, why not, tree): this rank's live state as plain local tensors (restore_into's input), or
    (None, why, None) when it is torn. Taken after the abort, so nothing here can wait on a peer; every
    DTensor becomes its local shard (host memory on a GPU), so the tree holds nothing of the old group."""
    from torch.distributed.fsdp import FSDPModule

    state = session.state
    step = state.live_step()
    if step is None:
        return None, f"failed mid-update of step {state.step + 1}", None
    try:
        for module in session.model.modules():  # a peer may fail mid-forward with its blocks unsharded
            if isinstance(module, FSDPModule):
                module.reshard()
        with torch.no_grad():
            tree = _local_tree(flatten_state(session.ckpt_state))
    except Exception as exc:  # anything: this rank cannot offer its live state, every rank falls back
        return None, f"live state not captured: {one_line(exc)}", None
    return step, None, tree


def _local_tree(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        local = obj.to_local() if isinstance(obj, DTensor) else obj
        return local.detach().cpu() if local.is_cuda else local.detach()
    if isinstance(obj, dict):
        return {k: _local_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_local_tree(v) for v in obj)
    return obj


def plan_restore(
    job: Job,
    previous: object | None,
    live: tuple[int | None, str | None, dict[str, Any] | None] = (None, "no live state", None),
    *,
    portable: bool = False,
) -> Plan:
    """Agree on the restore over the new group (see `agree`): one all-gather, before any model exists,
    so a rank that restores from live state or host memory can skip the seeded init."""
    live_step, why, _ = live
    mem_step = previous.memory_step() if previous is not None else None  # type: ignore[attr-defined]
    ckpt, ctx = job.cfg.checkpoint, _ctx(job)
    committed = None
    if ctx.rank == 0 and ckpt.mode != "off":
        root = checkpoints_dir(job.cfg.run.run_dir)
        committed = max((s for s in list_steps(root) if is_committed(root, s)), default=None)
    mine = Report(live=live_step, why=why, memory=mem_step, committed=committed, portable=portable)
    reports = exchange_reports(mine) if ctx.world_size > 1 else [mine]
    interval = ckpt.interval if ckpt.mode != "off" and not ckpt.auto else None
    return agree(reports, interval=interval, replicate=ctx.replicate)


def restore(
    job: Job,
    session: Session,
    previous: object | None,
    live: tuple[int | None, str | None, dict[str, Any] | None] = (None, "no live state", None),
    plan: Plan | None = None,
    *,
    seeded: bool = True,
    own_rng: dict[str, Any] | None = None,
) -> tuple[int | None, str, str | None]:
    """Restore `session` as every rank agreed (`plan_restore`, run here when not given); (step,
    source, why not live). `seeded`: the session's model was built with the seeded init, so a fallback
    that finds no checkpoint may start from it."""
    plan = plan or plan_restore(job, previous, live)
    if plan.source == "replica":
        return _restore_from_replica(job, session, live, plan, own_rng)
    if plan.source == "live":
        t0 = time.time()
        restore_into(session.ckpt_state, live[2])  # type: ignore[arg-type]
        job.events.emit(
            "resume", step=plan.step, source="live", duration_s=time.time() - t0, fallback_from=None, ts=t0
        )
        if plan.resave:
            session.checkpointer.maybe_save(plan.step, session.ckpt_state, force=True)  # type: ignore[arg-type]
        return plan.step, "live", None
    if plan.source == "memory":
        step = previous.load_from_memory(session.ckpt_state)  # type: ignore[attr-defined]
        if step is not None:
            return step, "memory", plan.why
        if not seeded:  # a disk fallback that found nothing would train from uninitialised weights
            raise RestartFailed(
                f"rank {_ctx(job).rank}: the agreed host copy of step {plan.step} is gone; exiting so the "
                "launcher restarts the group (from the seed or the newest commit)"
            )
    step = session.checkpointer.load(session.ckpt_state)
    return step, session.checkpointer.last_source or "none", plan.why


def _restore_from_replica(
    job: Job,
    session: Session,
    live: tuple[int | None, str | None, dict[str, Any] | None],
    plan: Plan,
    own_rng: dict[str, Any] | None,
) -> tuple[int | None, str, str | None]:
    """The plan's replica transfers (every rank, in the same order), then each rank's restore: a receiver
    from what it received (with its own RNG), the others from their own live state."""
    assert plan.replica is not None and plan.step is not None
    t0, rank = time.time(), _ctx(job).rank
    sender = plan.replica.sender_of(rank)
    template = flatten_state(session.ckpt_state) if sender is not None else None
    try:
        received, nbytes = replica.exchange(plan.replica, rank, live[2], template)
    except replica.ReplicaError as exc:
        raise RestartFailed(f"rank {rank}: {exc}; exiting so the launcher restarts the group") from None
    if received is None:
        restore_into(session.ckpt_state, live[2])  # type: ignore[arg-type]
        source, fields = "live", {"sent_bytes": nbytes} if nbytes else {}
    else:
        for key, state in session.ckpt_state.items():  # the RNG is this rank's own, taken before the rebuild
            received[key][state.rng_key] = own_rng if own_rng is not None else rng_state()
        restore_into(session.ckpt_state, received)
        source, fields = "replica", {"bytes": nbytes, "sender": sender, "shared_bytes": 0}
    job.events.emit(
        "resume", step=plan.step, source=source, duration_s=time.time() - t0, fallback_from=None, ts=t0,
        **fields,
    )  # fmt: skip
    if plan.resave:
        session.checkpointer.maybe_save(plan.step, session.ckpt_state, force=True)
    return plan.step, source, plan.why


def _close_quietly(checkpointer: object) -> None:
    try:
        checkpointer.close(drain=False)  # type: ignore[attr-defined]
    except Exception as exc:  # its groups are aborted; a failed in-flight save is expected here
        print(f"[inprocess] closing the previous checkpointer: {one_line(exc)}", file=sys.stderr, flush=True)


def _ctx(job: Job) -> DistContext:
    if job.ctx is None:
        raise RuntimeError("the job has no process group yet")
    return job.ctx


def build_session(job: Job, build: Build, *, init_weights: bool = True, live: bool = False) -> Session:
    """`build` on the current group, every RNG seeded first (the same weights at every start); `live`: the
    session resumes from the last one's live state (not a fault for `checkpoint.interval=auto`)."""
    seed_everything(job.cfg.run.seed, _ctx(job).rank)
    job.live_restart = live
    try:
        return build(job, init_weights=init_weights)
    finally:
        job.live_restart = False


def run_with_restarts(job: Job, build: Build, train: Train) -> Session:
    """Build, resume and train; with in-process restart enabled, recover soft faults in place."""
    cfg: InprocessConfig = job.cfg.inprocess
    ctx, events = _ctx(job), job.events
    if cfg.enabled:
        # What is alive now (modules, config, the job) outlives every restart: the full collection
        # that frees a failed session then scans only what came after (0.3 s -> ms on the test machine).
        gc.freeze()
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
        _close_quietly(previous)
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
                _close_quietly(previous)
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
