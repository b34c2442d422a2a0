"""`Job`: the per-process parts of the resilience layer, and `Step`: the bracket of one training step.

A `Job` lives as long as the process: its event log, its heartbeat to the launcher, the planned faults for
this rank, the drain flag (SIGTERM), the GC schedule; `ctx` is the current process group (rebuilt by an
in-process restart). A training loop talks to it once per step:

    with job.step(session) as step:   # top: a planned fault may fire; the data position and RNG are noted
        ...forward, backward...
        with step.update():           # the optimizer step: from here the live state is torn until the end
            optimizer.step(); ...
        step.report(loss)             # the step's one all-reduce: the mean loss, the drain flag, the interval
    # the end of the block: step event, drain (save, commit, exit 143), checkpoint if due, heartbeat, GC

The components decide "when" (the checkpointer its steps, the injector its faults), so the loop only reads
like the algorithm. Nothing here knows a model, an optimizer or a data format.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from fsdpkit.contracts import env, exitcodes
from fsdpkit.contracts.metrics_settings import MetricsSettings
from fsdpkit.resilience.compute_timer import CudaEventTimer, ThreadTimer, compute_timer
from fsdpkit.resilience.faults import FaultInjector
from fsdpkit.resilience.gc_schedule import GcSchedule
from fsdpkit.resilience.straggler import SPARES_ENV, STRAGGLER_EVENT, Straggler, StragglerDetector
from fsdpkit.runtime import pod
from fsdpkit.runtime.events import EventLog
from fsdpkit.runtime.eviction import EvictionRequest, request_eviction
from fsdpkit.runtime.heartbeat import HeartbeatClient
from fsdpkit.runtime.telemetry.trainer import TrainerMetrics

if TYPE_CHECKING:
    from fsdpkit.resilience.config import ResilienceConfig
    from fsdpkit.resilience.session import Session
    from fsdpkit.runtime.distributed import DistContext

DRAINED_EXIT = exitcodes.DRAINED
"""A drained worker's exit code, as if SIGTERM had ended it, after its step was committed."""


class DrainFlag:
    """SIGTERM on any rank (a drained pod) stops every rank of the job at the same step boundary.

    The handler only records the request. The step's all-reduce (`Step.report`) carries it (no extra
    collective), so every rank learns at the end of the same step that someone must leave; all save and
    commit that step, and then the workers exit DRAINED_EXIT: the survivors' launchers restart their group
    with a spare or the replacement pod, which resumes from exactly that step."""

    def __init__(self) -> None:
        self.requested = False
        self.agreed = False

    @classmethod
    def install(cls) -> DrainFlag:
        flag = cls()

        def on_term(signum: int, frame: object) -> None:
            flag.requested = True

        signal.signal(signal.SIGTERM, on_term)  # kept to the end: a drain during teardown changes nothing
        return flag


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, str(default)))


class Step:
    """One training step of one rank (made by `Job.step`); see the module docstring for the protocol."""

    def __init__(self, job: Job, session: Session) -> None:
        self.job = job
        self.session = session
        self.number = session.step + 1
        """The step this block computes (1-based: the first step of a run is 1)."""
        self.loss: float | None = None
        """The loss averaged over every rank, once `report` ran."""
        self.t_start = 0.0
        self.timer = job.compute_timer()
        """Times this rank's own work in the step (compute_timer: CPU time on CPU, CUDA events on a GPU)."""
        self.compute_s: float | None = None
        """This rank's own work in the step (the straggler detector's measure), once `report` ran."""
        self.duration_s = 0.0
        self._updated = False
        self._reported = False

    @contextlib.contextmanager
    def update(self) -> Iterator[None]:
        """Around the optimizer step (and the schedule's): the live state is torn from its start until the
        step is finished, so an in-process restart then falls back to a saved copy. Keep collectives (the
        gradient clipping's all-reduce) before it: on CUDA it opens the straggler measure's window."""
        if self._updated:
            raise RuntimeError(f"step {self.number}: step.update() entered twice; one update per step")
        state = self.session.state
        state.begin_update()
        self.timer.update_starts()
        yield
        self.job.faults.maybe_inject_in_update(self.number)
        state.step += 1
        state.end_update()
        self._updated = True

    def report(self, loss: torch.Tensor | float | None) -> float | None:
        """The step's one all-reduce (SUM, then / world): `loss` averaged over ranks, plus what every rank
        must agree on at this step: the drain flag (any rank's SIGTERM) and, with `checkpoint.interval=auto`,
        rank 0's interval. Call it after `update()`; a step that does not call it reports no loss."""
        if self._reported:  # a second all-reduce would hand the interval agreement a doubled value
            raise RuntimeError(f"step {self.number}: step.report() called twice; one report per step")
        job, checkpointer = self.job, self.session.checkpointer
        job.faults.maybe_inject_before_report(self.number)
        device = job.ctx.device if job.ctx is not None else torch.device("cpu")
        job.faults.slow_down(self.timer.end_own_work(), device)  # a `slow` fault: the straggler's extra work
        self.compute_s = self.timer.stop()  # None on CUDA until the all-reduce's result is back
        if self.compute_s is not None:
            job.stragglers.observe(self.compute_s)
        shares = job.stragglers.own_slot() if job.stragglers.due(self.number) else []
        if isinstance(loss, torch.Tensor):
            value = loss.detach().float().reshape(1).to(device)
        else:
            value = torch.tensor([0.0 if loss is None else float(loss)], device=device)
        interval = checkpointer.interval_proposal()
        carried = [float(job.drain.requested)] + ([interval] if interval is not None else [])
        reduced = torch.cat([value, torch.tensor(carried + shares, device=device)])
        world = job.ctx.world_size if job.ctx is not None else 1
        if world > 1:
            dist.all_reduce(reduced)
        agreed = reduced[1:].tolist()
        if self.compute_s is None:  # the events came before the all-reduce, whose result the host now holds
            self.compute_s = self.timer.read()
            job.stragglers.observe(self.compute_s)
        if shares:
            job.on_stragglers(job.stragglers.judge(agreed[len(carried) :], self.number), self.number)
        job.drain.agreed = job.drain.agreed or agreed[0] > 0
        if interval is not None:
            checkpointer.agree_interval(agreed[1])
        self.loss = None if loss is None else float(reduced[0]) / world
        self._reported = True
        return self.loss


class Job:
    """The per-process resilience parts; `run` makes one and hands it to the script's build and train."""

    def __init__(self, cfg: ResilienceConfig) -> None:
        self.cfg = cfg
        self.rank = _env_int("RANK", 0)
        self.world_size = _env_int("WORLD_SIZE", 1)
        self.ctx: DistContext | None = None
        """The current process group's context (rank, world size, device, mesh); set before `build`."""
        self.events = EventLog(cfg.run.run_dir, role="trainer", rank=self.rank)
        self.metrics = (
            TrainerMetrics.start(
                MetricsSettings.from_env(os.environ, run_id=cfg.run.id),  # checked by config.validate
                self.events,
                run_dir=cfg.run.run_dir,
                interval_steps=cfg.checkpoint.interval if isinstance(cfg.checkpoint.interval, int) else None,
                checkpoints=cfg.checkpoint.mode != "off",
            )
            if self.rank == 0
            else None
        )
        """Rank 0's live metrics (fsdpkit.runtime.telemetry); None on other ranks and with
        KIT_METRICS=off."""
        self.heartbeat = HeartbeatClient.from_env()
        self.faults = FaultInjector(
            cfg.fault,
            rank=self.rank,
            world_size=self.world_size,
            max_steps=cfg.training.steps,
            events=self.events,
            run_dir=cfg.run.run_dir,
            local_rank=_env_int("LOCAL_RANK", 0),
        )
        self.drain = DrainFlag.install()
        self.stragglers = StragglerDetector(
            cfg=cfg.straggler, rank=self.rank, world_size=self.world_size,
            ranks_per_node=_env_int("LOCAL_WORLD_SIZE", self.world_size),
        )  # fmt: skip
        """Every rank's compute, shared every straggler.every steps; the same verdicts on every rank."""
        self._spares = _env_int(SPARES_ENV, 0)
        self._timer: ThreadTimer | CudaEventTimer | None = None
        self._timer_device: torch.device | None = None
        self.gc = GcSchedule(cfg.training.gc_every)
        self.step_fields: Callable[[float], dict[str, Any]] | None = None
        """Optional: more fields for each step event from the step's duration (the kit adds tokens/s, MFU)."""
        self.live_restart = False
        """Set by the in-process restart while a session resumes from the last one's live state."""
        self.last_step_emitted = 0
        """The last step this process emitted a step event for."""
        self.step_started = 0.0
        """When the current (or last) step started."""

    @property
    def last_step(self) -> int:
        """The step the run ends at: training.stop_at, else training.steps."""
        return self.cfg.training.stop_at or self.cfg.training.steps

    def compute_timer(self) -> ThreadTimer | CudaEventTimer:
        """The timer of this rank's own work, for the current group's device (kept across steps: its CUDA
        events and probe are made once)."""
        device = self.ctx.device if self.ctx is not None else torch.device("cpu")
        if self._timer is None or self._timer_device != device:
            self._timer, self._timer_device = compute_timer(device), device
        return self._timer

    def log(self, message: str) -> None:
        if self.rank == 0:
            print(f"[trainer] {message}", flush=True)

    def on_stragglers(self, found: list[Straggler], step: int) -> None:
        """Newly confirmed stragglers: rank 0 reports each (event, one line); with policy `replace` and a
        hot spare, the slow node's local rank 0 asks its launcher to evict the node (training/runtime/
        eviction.py): the launcher cordons and labels it (the Job's replacement pod must not land there
        again) and drains its pod, so every rank saves and commits the agreed step and the spare takes the
        node's place (the drain path: 0 lost steps). Ranks only report; node actions are the launcher's."""
        for s in found:
            evict = self.cfg.straggler.policy == "replace" and self._spares > 0
            if self.rank == 0:
                self._report_straggler(s, step, evict=evict)
            here = self.rank // self.stragglers.ranks_per_node == s.node
            if here and _env_int("LOCAL_RANK", 0) == 0:  # the slow node names itself: pod and host
                print(
                    f"[trainer] this node (pod {pod.pod_index()}, host {socket.gethostname()}) holds "
                    f"straggler rank {s.rank}"
                    + ("; its launcher evicts it for a hot spare" if evict else ""),
                    flush=True,
                )
                if evict:
                    self._request_eviction(s, step)
                else:
                    self.events.emit(
                        "straggler_node", step=step, target_rank=s.rank, pod=pod.pod_index(), evict=False,
                        node_name=os.environ.get(env.NODE_NAME) or None, cordoned=False,
                    )  # fmt: skip

    def _report_straggler(self, s: Straggler, step: int, *, evict: bool) -> None:
        self.events.emit(
            STRAGGLER_EVENT, step=step, target_rank=s.rank, target_node=s.node, score=s.score,
            since_step=s.since_step, compute_s=s.compute_s, peers_s=s.peers_s, evict=evict,
            threshold=self.stragglers.threshold,
        )  # fmt: skip
        action = (
            "evicting its node at this step boundary (a spare takes over)"
            if evict
            else "policy replace, but no hot spare: reported only"
            if self.cfg.straggler.policy == "replace"
            else "policy report"
        )
        self.log(
            f"straggler: rank {s.rank} on node {s.node} computes {s.score:.2f}x slower than its "
            f"peers ({s.compute_s:.3f} s against {s.peers_s:.3f} s a step) since step "
            f"~{s.since_step}; {action}"
        )

    def _request_eviction(self, s: Straggler, step: int) -> None:
        """Leave the eviction request in the kit launcher's channel; one line when there is no launcher."""
        folder = os.environ.get(env.HEARTBEAT_DIR)
        if not folder:
            print("[trainer] no kit launcher to evict this node (no heartbeat folder): reported only")
            return
        reason = (
            f"run {self.cfg.run.id}: rank {s.rank} (pod {os.environ.get(pod.POD_NAME_ENV, '?')}) computed "
            f"{s.score:.2f}x slower than its peers from step ~{s.since_step}; evicted at step {step}"
        )
        request_eviction(folder, EvictionRequest(rank=s.rank, step=step, pod=pod.pod_index(), reason=reason))

    def step(self, session: Session) -> contextlib.AbstractContextManager[Step]:
        """The bracket of the next step of `session` (see the module docstring)."""
        return self._step(session)

    @contextlib.contextmanager
    def _step(self, session: Session) -> Iterator[Step]:
        step = Step(self, session)
        self.faults.maybe_inject(step.number)
        step.t_start = self.step_started = time.time()
        step.timer.start()
        if self.cfg.inprocess.enabled:  # its snapshot (data position, RNG) serves only an in-process restart
            session.state.begin_step()
        yield step
        if not step._updated:
            raise RuntimeError(
                f"step {step.number}: the block ended without `with step.update():` around the optimizer "
                "step; every step updates once"
            )
        if not step._reported:
            step.report(None)
        session.state.end_step()
        step.duration_s = time.time() - step.t_start
        self._after_step(session, step)

    def complete_step(self, session: Session, step: int, *, failed_at: float) -> None:
        """After a restore at `step` from live state: a step whose update completed but whose report
        failed (fsdpkit.resilience.replica) gets the step event it never had, so the run's record holds
        every step once (its loss is unknown: the report's all-reduce never finished; its duration runs
        to the fault, `failed_at`)."""
        if self.last_step_emitted >= step:
            return
        t_start = self.step_started or failed_at
        duration = max(0.0, failed_at - t_start)
        fields = self.step_fields(duration) if self.step_fields is not None else {}
        self.events.emit(
            "step", step=step, loss=None, duration_s=duration, t_start=t_start, completed_by="restore",
            **fields,
        )  # fmt: skip
        self.last_step_emitted = step

    def _after_step(self, session: Session, step: Step) -> None:
        self.last_step_emitted = step.number
        fields = self.step_fields(step.duration_s) if self.step_fields is not None else {}
        self.events.emit(
            "step", step=step.number, loss=step.loss, duration_s=step.duration_s, t_start=step.t_start,
            compute_s=step.compute_s, **fields,
        )  # fmt: skip
        checkpointer = session.checkpointer
        if checkpointer.due(step.number):  # a slow save must not look like a hang to the launcher
            self.heartbeat.phase("checkpoint")
        if self.drain.agreed:
            self.drain_and_exit(session)
        checkpointer.maybe_save(step.number, session.ckpt_state)
        self.heartbeat.beat(step.number)
        self.gc.after_step(step.number)
        every = self.cfg.training.log_every
        if step.number % every == 0 or step.number == self.cfg.training.steps:
            loss = f" loss {step.loss:.4f}" if step.loss is not None else ""
            rate = fields.get("tokens_per_s")
            more = f", {rate:,.0f} tokens/s per GPU" if rate is not None else ""
            more += f", MFU {fields['mfu']:.1%}" if fields.get("mfu") is not None else ""
            self.log(f"step {step.number}/{self.cfg.training.steps}{loss} ({step.duration_s:.3f} s{more})")

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

    def drain_and_exit(self, session: Session) -> None:
        """A pod is drained: every rank saves and commits this step (after any save in flight), then exits.

        The barrier holds every rank until rank 0 has written the commit record, so a drained pod never
        leaves before the step it stopped at is committed (design: guarantees)."""
        step = session.step
        self.heartbeat.phase("checkpoint")
        t0 = time.time()
        session.checkpointer.wait()
        session.checkpointer.maybe_save(step, session.ckpt_state, force=True)
        session.checkpointer.wait()
        if self.ctx is not None and self.ctx.world_size > 1:
            dist.barrier()
        self.events.emit("drained", step=step, duration_s=time.time() - t0, signalled=self.drain.requested)
        self.log(f"drained: step {step} committed in {time.time() - t0:.2f} s; leaving")
        session.checkpointer.close()
        raise SystemExit(DRAINED_EXIT)  # run()'s `finally` closes the event log and the heartbeat

    def finish(self, session: Session, *, after_save: Callable[[], None] | None = None) -> None:
        """Drain the in-flight save (timed on its own), save the final step, report planned faults that
        never fired (an event each and one line), emit `end`."""
        step = session.step
        self.heartbeat.phase("checkpoint")
        session.checkpointer.wait()  # emits the `drain` event when a save was in flight
        session.checkpointer.maybe_save(step, session.ckpt_state, force=True)
        session.checkpointer.wait()
        if after_save is not None:
            after_save()
        for fault in self.faults.unfired() if self.rank == 0 else []:
            self.events.emit("fault_unfired", fault=str(fault), planned_step=fault.step, step=step)
            print(
                f"[trainer] warning: planned fault {fault} never fired (the run ended at step {step}); "
                "this run does not prove its recovery",
                file=sys.stderr,
                flush=True,
            )
        self.events.emit("end", step=step)
        self.log(f"done at step {step}")

    def emit_start(self, **fields: Any) -> None:
        self.events.emit(
            "start", world_size=self.world_size, ckpt_mode=self.cfg.checkpoint.mode, **fields
        )  # fmt: skip

    def close(self) -> None:
        """Stop the fault timer, send the final heartbeat, close the event log, turn automatic GC back on."""
        self.gc.close()
        self.faults.close()
        self.heartbeat.close()
        if self.metrics is not None:
            self.metrics.close()
        self.events.close()
