"""The trainer: `python -m training.train [--config FILE.yaml] [--section.field VALUE ...]`.

A Llama-style decoder trained with FSDP2 (`fully_shard` per block, then the root), AdamW, linear warmup
then cosine decay, gradient clipping, bf16 mixed precision on GPU. Runs under any launcher that sets the
torch.distributed environment (torchrun, `python -m training.launch`, NVRx's ft_launcher), or alone.

Exit codes: 0 done; 78 bad config (one line on stderr, no traceback); 143 drained (SIGTERM: the job
saved and committed the agreed step, see `DrainFlag`); anything else is a real failure, recorded by
torch.distributed.elastic's `@record` for the launcher (its file written atomically: training.error_file).
"""

from __future__ import annotations

import functools
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from training import efa, exitcodes, memory_plan, throughput
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.layout import checkpoints_dir
from training.checkpoint.resume import CheckpointError, check_world_size
from training.config import ConfigError, OptimConfig, TrainConfig, help_text, load_config
from training.data import TokenLoader
from training.distributed import DistContext, init_distributed, seed_everything, set_deterministic, shutdown
from training.error_file import AtomicErrorHandler
from training.events import EventLog
from training.faults import FaultInjector
from training.gc_schedule import GcSchedule
from training.heartbeat import HeartbeatClient
from training.model import build_model, loss_fn
from training.shapes import MODEL_CONFIGS
from training.state import TrainState


def lr_schedule(cfg: OptimConfig, total_steps: int) -> Callable[[int], float]:
    """Multiplier of cfg.lr at scheduler step i (0-based): linear warmup, then cosine down to min_lr."""
    floor = cfg.min_lr / cfg.lr

    def factor(i: int) -> float:
        if i < cfg.warmup_steps:
            return (i + 1) / cfg.warmup_steps
        span = max(1, total_steps - cfg.warmup_steps)
        progress = min(1.0, (i - cfg.warmup_steps) / span)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


@dataclass
class Session:
    """Everything bound to one process group: rebuilt after an in-process restart."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    state: TrainState
    checkpointer: Checkpointer

    @property
    def ckpt_state(self) -> dict[str, TrainState]:
        return {"train": self.state}


def build_session(
    cfg: TrainConfig,
    ctx: DistContext,
    events: EventLog,
    *,
    heartbeat: HeartbeatClient | None = None,
    init_weights: bool = True,
    live: bool = False,
) -> Session:
    """Model (initialised from the seed; `init_weights=False`: left as allocated, for a caller that
    restores every value at once), optimizer, schedule, data at position 0, checkpointer (whose waits
    run in the heartbeat's "checkpoint" phase; `live`: the session resumes from the last one's live
    state)."""
    seed_everything(cfg.run.seed, ctx.rank)
    args = MODEL_CONFIGS[cfg.model.name]
    param_dtype = torch.bfloat16 if ctx.device.type == "cuda" else None
    model = build_model(
        args,
        mesh=ctx.mesh,
        device=ctx.device,
        seed=cfg.run.seed,
        param_dtype=param_dtype,
        activation_checkpointing=cfg.model.activation_checkpointing,
        compile_blocks=cfg.model.compile,
        init_weights=init_weights,
    )
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=cfg.optim.lr,
        betas=(cfg.optim.beta1, cfg.optim.beta2),
        weight_decay=cfg.optim.weight_decay,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(cfg.optim, cfg.training.steps))
    data = TokenLoader(
        cfg.data, vocab_size=args.vocab_size, seed=cfg.run.seed, rank=ctx.rank, world_size=ctx.world_size
    )
    state = TrainState(model=model, optimizer=optimizer, scheduler=scheduler, data=data, rank=ctx.rank)
    checkpointer = Checkpointer(
        cfg.checkpoint,
        run_dir=cfg.run.run_dir,
        rank=ctx.rank,
        world_size=ctx.world_size,
        events=events,
        on_wait=heartbeat.checkpoint_wait if heartbeat is not None else None,
        live=live,
    )
    return Session(model=model, optimizer=optimizer, state=state, checkpointer=checkpointer)


DRAINED_EXIT = exitcodes.DRAINED
"""A drained worker's exit code, as if SIGTERM had ended it, after its step was committed."""


class DrainFlag:
    """SIGTERM on any rank (a drained pod) stops every rank of the job at the same step boundary.

    The handler only records the request. The step's loss all-reduce carries it (no extra collective), so
    every rank learns at the end of the same step that someone must leave; all save and commit that step,
    and then the workers exit DRAINED_EXIT: the survivors' launchers restart their group with a spare or the
    replacement pod, which resumes from exactly that step."""

    def __init__(self) -> None:
        self.requested = False
        self.agreed = False

    @classmethod
    def install(cls) -> DrainFlag:
        flag = cls()

        def on_term(signum: int, frame: object) -> None:
            flag.requested = True

        signal.signal(signal.SIGTERM, on_term)
        return flag


def train_step(
    session: Session,
    *,
    device: torch.device,
    grad_clip: float,
    world_size: int,
    accum: int = 1,
    drain: DrainFlag | None = None,
    after_update: Callable[[int], None] | None = None,
) -> float:
    """One optimizer step over this rank's next `accum` micro-batches; returns the loss averaged over ranks.

    Each micro-batch's loss is divided by `accum` so the summed gradients are the mean over the step's
    samples; FSDP2 reduces after every backward and accumulates into the sharded gradients. With `drain`,
    the same all-reduce tells every rank whether any rank got SIGTERM (`drain.agreed`); with an auto
    checkpoint interval, it hands every rank rank 0's interval (`Checkpointer.agree_interval`).
    The state brackets the step (`TrainState.begin_step` ... `end_step`), so an in-process restart knows
    whether this rank's live state is clean; `after_update(step)` runs right after the optimizer step
    (the fault injector's test hook)."""
    state = session.state
    state.begin_step()
    total = torch.zeros((), device=device)
    for _ in range(accum):
        inputs, targets = state.data.next_batch()
        loss = loss_fn(session.model(inputs.to(device)), targets.to(device)) / accum
        loss.backward()
        total += loss.detach()
    loss = total
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(session.model.parameters(), grad_clip)
    state.begin_update()
    session.optimizer.step()
    if after_update is not None:
        after_update(state.step + 1)
    session.optimizer.zero_grad(set_to_none=True)
    state.scheduler.step()
    state.step += 1
    reported = loss.detach().float()
    # What every rank must agree on at this step rides on the loss all-reduce (SUM), never an extra
    # collective: the drain flag (any rank's SIGTERM) and, with checkpoint.interval=auto, rank 0's interval.
    interval = session.checkpointer.interval_proposal()
    carried = [float(drain.requested)] if drain is not None else []
    carried += [interval] if interval is not None else []
    if carried:
        reported = torch.cat([reported.view(1), torch.tensor(carried, device=reported.device)])
    if world_size > 1:
        dist.all_reduce(reported)
    if carried:
        agreed = reported[1:].tolist()
        reported = reported[0]
        if drain is not None:
            drain.agreed = drain.agreed or agreed.pop(0) > 0
        if interval is not None:
            session.checkpointer.agree_interval(agreed.pop(0))
    if world_size > 1:
        reported /= world_size
    state.end_step()
    return float(reported)


class Trainer:
    """Owns the per-process parts (events, heartbeat, faults) and runs the loop over a Session."""

    def __init__(self, cfg: TrainConfig, ctx: DistContext) -> None:
        self.cfg = cfg
        self.ctx = ctx
        self.events = EventLog(cfg.run.run_dir, role="trainer", rank=ctx.rank)
        self.heartbeat = HeartbeatClient.from_env()
        self.faults = FaultInjector(
            cfg.fault,
            rank=ctx.rank,
            world_size=ctx.world_size,
            max_steps=cfg.training.steps,
            events=self.events,
            run_dir=cfg.run.run_dir,
            local_rank=ctx.local_rank,
        )
        self.drain = DrainFlag.install()
        self.gc = GcSchedule(cfg.training.gc_every)
        self._flops_token: float | None = None
        self._peak: float | None = None

    def throughput(self, duration_s: float) -> throughput.Throughput:
        """Tokens/s of this rank (one GPU) and MFU for a step that took `duration_s`."""
        cfg, args = self.cfg, MODEL_CONFIGS[self.cfg.model.name]
        if self._flops_token is None:
            self._flops_token = throughput.flops_per_token(
                params=args.num_params(),
                vocab_size=args.vocab_size,
                dim=args.dim,
                n_layers=args.n_layers,
                seq_len=cfg.data.seq_len,
            )
            name = torch.cuda.get_device_name(self.ctx.device) if self.ctx.device.type == "cuda" else "cpu"
            self._peak = throughput.peak_flops(name)
        tokens = cfg.data.batch_size * cfg.data.seq_len * cfg.training.grad_accum_steps
        return throughput.measure(
            tokens=tokens, duration_s=duration_s, flops_token=self._flops_token, peak=self._peak
        )

    def log(self, message: str) -> None:
        if self.ctx.rank == 0:
            print(f"[trainer] {message}", flush=True)

    def resume(self, session: Session) -> int | None:
        """Restore the newest committed, verified checkpoint from disk; None means a fresh start.
        The checkpointer emits the `resume` event (with any fallback); with checkpoints off, we do."""
        self.heartbeat.phase("load")
        t0 = time.time()
        step = session.checkpointer.load(session.ckpt_state)
        if self.cfg.checkpoint.mode == "off":
            self.events.emit(
                "resume", step=None, source="none", duration_s=time.time() - t0, fallback_from=None
            )
        self.log(f"resumed from step {step}" if step is not None else "no checkpoint: starting at step 0")
        self.heartbeat.phase("train")
        return step

    def train_loop(self, session: Session, *, heartbeat: HeartbeatClient | None = None) -> None:
        heartbeat = heartbeat or self.heartbeat
        cfg = self.cfg
        last = cfg.training.stop_at or cfg.training.steps
        while session.state.step < last:
            step = session.state.step + 1
            self.faults.maybe_inject(step)
            t_start = time.time()
            loss = train_step(
                session,
                device=self.ctx.device,
                grad_clip=cfg.optim.grad_clip,
                world_size=self.ctx.world_size,
                accum=cfg.training.grad_accum_steps,
                drain=self.drain,
                after_update=self.faults.maybe_inject_in_update,
            )
            duration = time.time() - t_start
            rate = self.throughput(duration)
            self.events.emit(
                "step",
                step=step,
                loss=loss,
                duration_s=duration,
                t_start=t_start,
                tokens_per_s=rate.tokens_per_s,
                mfu=rate.mfu,
            )
            if session.checkpointer.due(step):  # a slow save must not look like a hang to the launcher
                heartbeat.phase("checkpoint")
            if self.drain.agreed:
                self.leave(session, heartbeat)
            session.checkpointer.maybe_save(step, session.ckpt_state)
            heartbeat.beat(step)
            self.gc.after_step(step)
            if step % cfg.training.log_every == 0 or step == cfg.training.steps:
                mfu = f", MFU {rate.mfu:.1%}" if rate.mfu is not None else ""
                self.log(
                    f"step {step}/{cfg.training.steps} loss {loss:.4f} ({duration:.3f} s, "
                    f"{rate.tokens_per_s:,.0f} tokens/s per GPU{mfu})"
                )

    def leave(self, session: Session, heartbeat: HeartbeatClient) -> None:
        """A pod is drained: every rank saves and commits this step (after any save in flight), then exits.

        The barrier holds every rank until rank 0 has written the commit record, so a drained pod never
        leaves before the step it stopped at is committed (design: guarantees)."""
        step = session.state.step
        heartbeat.phase("checkpoint")
        t0 = time.time()
        session.checkpointer.wait()
        session.checkpointer.maybe_save(step, session.ckpt_state, force=True)
        session.checkpointer.wait()
        if self.ctx.world_size > 1:
            dist.barrier()
        self.events.emit("drained", step=step, duration_s=time.time() - t0, signalled=self.drain.requested)
        self.log(f"drained: step {step} committed in {time.time() - t0:.2f} s; leaving")
        session.checkpointer.close()
        raise SystemExit(DRAINED_EXIT)  # run()'s `finally` closes the event log and the heartbeat

    def finish(self, session: Session) -> None:
        """Drain the in-flight save (timed on its own), save the final step, optionally dump the model."""
        step = session.state.step
        self.heartbeat.phase("checkpoint")
        session.checkpointer.wait()  # emits the `drain` event when a save was in flight
        session.checkpointer.maybe_save(step, session.ckpt_state, force=True)
        session.checkpointer.wait()
        if self.cfg.training.dump_final:
            dump_full_state(session, Path(self.cfg.training.dump_final), rank=self.ctx.rank)
        self.events.emit("end", step=step)
        self.log(f"done at step {step}")

    def run(self) -> int:
        from training.inprocess import run_with_restarts

        self.emit_start()
        self.heartbeat.phase("start")
        try:
            session = run_with_restarts(self)
            self.finish(session)
            session.checkpointer.close()
        finally:
            self.close()
        return exitcodes.OK

    def emit_start(self) -> None:
        cfg = self.cfg
        self.events.emit(
            "start", world_size=self.ctx.world_size, model=cfg.model.name, ckpt_mode=cfg.checkpoint.mode
        )

    def close(self) -> None:
        """Stop the fault timer, send the final heartbeat, close the event log, turn automatic GC back on."""
        self.gc.close()
        self.faults.close()
        self.heartbeat.close()
        self.events.close()


def dump_full_state(session: Session, path: Path, *, rank: int) -> None:
    """Rank 0 writes the unsharded model and optimizer state (a collective: every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(session.model, session.optimizer, options=opts)
    if rank == 0:
        tmp = path.with_name(path.name + ".tmp")
        torch.save({"step": session.state.step, "model": model_sd, "optim": optim_sd}, tmp)
        tmp.replace(path)


def check_memory(cfg: TrainConfig) -> str:
    """The memory plan's line for this job, or ConfigError with the fixes: before any process group, so a job
    that cannot fit fails at once (exit 78) instead of in a CUDA OOM after the nodes were paid for."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    host = memory_plan.host_memory_bytes()
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        capacity = torch.cuda.get_device_properties(int(os.environ.get("LOCAL_RANK", "0"))).total_memory
    else:
        capacity = host // max(1, local)
    shape = MODEL_CONFIGS[cfg.model.name]
    try:
        return memory_plan.plan_line(
            cfg, shape, world=world, ranks_per_node=local, device_capacity=capacity, host_capacity=host,
            on_gpu=on_gpu,
        )  # fmt: skip
    except memory_plan.MemoryPlanError as exc:
        raise ConfigError(str(exc)) from None


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


@functools.partial(record, error_handler=AtomicErrorHandler())
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(help_text())
        return exitcodes.OK
    try:
        cfg = load_config(argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exitcodes.FATAL_CONFIG
    try:
        plan_line = check_memory(cfg)
        if cfg.checkpoint.mode != "off":  # a checkpoint of another world size: refused before any group
            check_world_size(checkpoints_dir(cfg.run.run_dir), int(os.environ.get("WORLD_SIZE", "1")))
    except (ConfigError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exitcodes.FATAL_CONFIG
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"[trainer] {plan_line}", flush=True)
    set_deterministic(cfg.training.deterministic)
    if cfg.inprocess.enabled and cfg.inprocess.backend == "nvrx":
        from training.inprocess import run_under_nvrx

        return run_under_nvrx(cfg)
    if cfg.training.efa_devices:
        efa.prepare_nccl_log()
    ctx = init_distributed(timeout_s=cfg.training.collective_timeout_s)
    try:
        problem = verify_fabric(cfg.training.efa_devices, ctx)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return exitcodes.FATAL_CONFIG
        return Trainer(cfg, ctx).run()
    except CheckpointError as exc:  # checkpoints exist but none verifies: never restart from step 0
        print(f"error: {exc}", file=sys.stderr)
        return exitcodes.FATAL_CONFIG
    finally:
        shutdown()


if __name__ == "__main__":
    from training.leave import leave

    leave(main())
