"""What an in-process restart restores from, and the restore: every rank's report, the one plan they agree
on (live, a live replica, the host copy, or the checkpoint: fsdpkit.resilience.inprocess says when each
serves), and each rank's part of it."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from fsdpkit.resilience import replica
from fsdpkit.resilience.checkpoint.layout import checkpoints_dir, is_committed, list_steps
from fsdpkit.resilience.checkpoint.resume import one_line
from fsdpkit.resilience.checkpoint.staging import flatten_state, restore_into
from fsdpkit.resilience.replica import ReplicaPlan
from fsdpkit.resilience.restart_store import RestartFailed
from fsdpkit.resilience.state import rng_state
from fsdpkit.runtime.distributed import seed_everything

if TYPE_CHECKING:
    from fsdpkit.resilience.job import Job
    from fsdpkit.resilience.session import Session
    from fsdpkit.runtime.distributed import DistContext


class Build(Protocol):
    """The script's builder: a fresh Session on `job.ctx` (seeded init, or values left as allocated when
    `init_weights` is False because every value is restored at once)."""

    def __call__(self, job: Job, *, init_weights: bool) -> Session: ...


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
    ckpt, ctx = job.cfg.checkpoint, require_ctx(job)
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
                f"rank {require_ctx(job).rank}: the agreed host copy of step {plan.step} is gone; exiting so "
                "the launcher restarts the group (from the seed or the newest commit)"
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
    t0, rank = time.time(), require_ctx(job).rank
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


def close_quietly(checkpointer: object) -> None:
    try:
        checkpointer.close(drain=False)  # type: ignore[attr-defined]
    except Exception as exc:  # its groups are aborted; a failed in-flight save is expected here
        print(f"[inprocess] closing the previous checkpointer: {one_line(exc)}", file=sys.stderr, flush=True)


def require_ctx(job: Job) -> DistContext:
    if job.ctx is None:
        raise RuntimeError("the job has no process group yet")
    return job.ctx


def build_session(job: Job, build: Build, *, init_weights: bool = True, live: bool = False) -> Session:
    """`build` on the current group, every RNG seeded first (the same weights at every start); `live`: the
    session resumes from the last one's live state (not a fault for `checkpoint.interval=auto`)."""
    seed_everything(job.cfg.run.seed, require_ctx(job).rank)
    job.live_restart = live
    try:
        return build(job, init_weights=init_weights)
    finally:
        job.live_restart = False
