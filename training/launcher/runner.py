"""Runs the kit's elastic agent the way torchrun's `launch_agent` runs the stock one, and maps the
outcome to the kit's exit codes.

`launch_agent` hard-codes `LocalElasticAgent`, so this builds the same WorkerSpec (rendezvous handler
from the registry, torchrun's LaunchConfig defaults) around `KitElasticAgent`, and closes the
rendezvous at the end unless the launcher was signalled (as `launch_agent` does): peers then leave
their next rendezvous at once instead of waiting for its timeout. Before closing it records why (the run
finished, or failed with the exit code and reason: rendezvous/outcome.py), so a pod that finds it closed
tells one from the other: a spare that was never needed exits 0 when the run finished, and any pod exits
RUN_FAILED (69: the Job fails) when it failed, never 0. A node that was given up leaves it open (the others
go on with a spare).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from torch.distributed.elastic.agent.server.api import RunResult, WorkerSpec, WorkerState
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters
from torch.distributed.elastic.rendezvous.api import RendezvousClosedError, RendezvousError
from torch.distributed.launcher.api import LaunchConfig

from fsdpkit.contracts import env, exitcodes
from fsdpkit.launcher import rendezvous
from fsdpkit.launcher.agent import KitElasticAgent
from fsdpkit.launcher.args import LaunchArgs
from fsdpkit.launcher.monitor import HeartbeatMonitor, HeartbeatSettings
from fsdpkit.launcher.node_actions import NodeActions
from fsdpkit.launcher.node_failures import NodeFailures
from fsdpkit.launcher.rendezvous.c10d import KitOpExecutor, wait_for_first_round
from fsdpkit.launcher.rendezvous.outcome import RecordsOutcome, RunOutcome
from fsdpkit.launcher.zygote import Zygote, prewarm_modules, worker_command
from fsdpkit.runtime import pod
from fsdpkit.runtime import torch_internals as internals
from fsdpkit.runtime.events import EventLog
from fsdpkit.runtime.heartbeat import HEARTBEAT_DIR_ENV
from fsdpkit.runtime.run_token import run_key
from fsdpkit.runtime.stacks import STACKS_DIR_ENV
from fsdpkit.runtime.telemetry.launcher import LauncherMetrics

log = logging.getLogger("kit.launch")


def run(args: LaunchArgs, *, workdir: str) -> int:
    """Start the zygote (if any), run the agent, and return the launcher's exit code."""
    c10d = args.rdzv_backend == "c10d"  # torch's rendezvous internals matter only on its rendezvous
    overrides = (KitElasticAgent, KitOpExecutor) if c10d else (KitElasticAgent,)
    problem = internals.check(overrides=overrides, c10d_rendezvous=c10d)
    if problem is not None:  # before any store, zygote or worker: the same on every pod, never retried
        log.error("kit-launch: error: %s", problem)
        return exitcodes.FATAL_CONFIG
    events = EventLog(args.run_dir, role="launcher", rank=None)
    events.emit("launcher_start", node_rank=args.node_rank, nodes=args.max_nodes, spares=args.spares)
    entrypoint, worker_args = args.entrypoint, list(args.argv)
    zygote = None
    if args.zygote:
        # Forked before the agent creates threads or stores: the zygote holds torch, nothing else.
        zygote = Zygote(workdir, prewarm=prewarm_modules(worker_args))
        os.environ.update(zygote.env)
        entrypoint, worker_args = worker_command(worker_args)
    # After the fork: the metrics' publisher thread must not be running when the zygote is made.
    metrics = LauncherMetrics.start(
        args.metrics,
        events,
        run_dir=args.run_dir,
        node_rank=args.node_rank,
        max_restarts=args.max_restarts,
        spares=args.spares,
    )
    try:
        code, reason = _run_agent(args, entrypoint, worker_args, events, zygote, metrics)
    except internals.TorchInternalsChanged as exc:  # an attribute torch sets on an object it built
        log.error("kit-launch: error: %s", exc)
        code, reason = exitcodes.FATAL_CONFIG, str(exc)
    finally:
        if zygote is not None:
            zygote.close()
    events.emit("exit", code=code, reason=reason)
    if metrics is not None:
        metrics.close()
    events.close()
    return code


def rendezvous_setup_error(endpoint: str, exc: BaseException) -> str:
    """One line for a rendezvous store that cannot be hosted or reached (torch chains the real cause)."""
    causes = []
    while exc is not None:
        causes.append(" ".join(str(exc).split()))
        exc = exc.__cause__ or exc.__context__
    text = "; ".join(causes)
    if "EADDRINUSE" in text or "address already in use" in text.lower():
        return (
            f"--rdzv-endpoint {endpoint}: the port is already in use on this host; pick a free port "
            "or stop what holds it"
        )
    return (
        f"--rdzv-endpoint {endpoint}: cannot host or reach the rendezvous store ({causes[-1]}); "
        "check HOST:PORT"
    )


def _run_agent(
    args: LaunchArgs,
    entrypoint: str,
    worker_args: list[str],
    events: EventLog,
    zygote: Zygote | None,
    metrics: LauncherMetrics | None,
) -> tuple[int, str]:
    """Build torchrun's WorkerSpec around the kit's agent, run it, and map its outcome to an exit."""
    config = _launch_config(args)
    params = RendezvousParameters(
        backend=config.rdzv_backend,
        endpoint=config.rdzv_endpoint,
        run_id=config.run_id,
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        local_addr=config.local_addr,
        spare=rendezvous.is_spare(args.node_rank, args.max_nodes),
        **config.rdzv_configs,  # the keep-alive too: the kit's creators read it in fractions of a second
    )
    master_addr, master_port = internals.addr_and_port(params)
    os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = config.signals_to_handle
    try:  # hosts or joins the store now
        rdzv_handler = _rendezvous_handler(args, params, events)
    except (RendezvousError, RuntimeError, ValueError, OSError) as exc:  # OSError: serve_store
        message = rendezvous_setup_error(args.rdzv_endpoint, exc)
        log.error("kit-launch: error: %s", message)
        return exitcodes.USAGE, message
    run_key(say=True)  # the store is reached: no token is worth a line now, never before a refusal
    spec = WorkerSpec(
        role=config.role,
        local_world_size=config.nproc_per_node,
        entrypoint=entrypoint,
        args=tuple(worker_args),
        rdzv_handler=rdzv_handler,
        max_restarts=config.max_restarts,
        monitor_interval=config.monitor_interval,
        master_addr=master_addr,
        master_port=master_port,
        local_addr=config.local_addr,
    )
    join_timeout = float(args.rdzv_configs.get("join_timeout", 600))
    agent = _make_agent(args, spec, config, events, zygote, metrics, join_timeout=join_timeout)
    return _run_to_the_end(args, agent, spec, events, join_timeout=join_timeout)


def _launch_config(args: LaunchArgs) -> LaunchConfig:
    """torchrun's LaunchConfig for the checked flags (its defaults for the rest)."""
    return LaunchConfig(
        min_nodes=args.min_nodes,
        max_nodes=args.max_nodes,
        nproc_per_node=args.nproc_per_node,
        logs_specs=DefaultLogsSpecs(log_dir=args.log_dir),
        run_id=args.rdzv_id,
        role="trainer",
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_backend=args.rdzv_backend,
        rdzv_configs=dict(args.rdzv_configs),
        max_restarts=args.max_restarts,
        monitor_interval=args.monitor_interval,
        local_addr=os.environ.get(env.LOCAL_ADDR) or None,  # the local runner's 127.0.0.1; else the FQDN
    )  # no shutdown_timeout: torch 2.11's LaunchConfig has none (the agent takes it, where torch does)


def _rendezvous_handler(
    args: LaunchArgs, params: RendezvousParameters, events: EventLog
) -> RendezvousHandler:
    """The backend's handler from torch's rendezvous registry (the kit's backends registered in it), which
    hosts or joins the store; the kit's emits its reconnects and rounds."""
    rdzv_handler = rendezvous.create_handler(params)
    if isinstance(rdzv_handler, rendezvous.KitRendezvous):
        rdzv_handler.link.on_reconnect.append(
            lambda: events.emit("rdzv_store_reconnected", endpoint=args.rdzv_endpoint)
        )
        rdzv_handler.on_round.append(
            lambda j: events.emit(
                "rdzv_round",
                round=j.round,
                rank=j.rank,
                world=j.world,
                asked_at=round(j.asked_at, 4),
                wait_s=round(j.formed_at - j.asked_at, 4),
                beat_gap_max_s=round(j.beat_gap_max_s, 4),
            )
        )
    return rdzv_handler


def _make_agent(
    args: LaunchArgs,
    spec: WorkerSpec,
    config: LaunchConfig,
    events: EventLog,
    zygote: Zygote | None,
    metrics: LauncherMetrics | None,
    *,
    join_timeout: float,
) -> KitElasticAgent:
    """The kit's agent with its heartbeat monitor (whose last step the live metrics report)."""
    settings = HeartbeatSettings(
        timeout_s=args.heartbeat_timeout_s,
        load_timeout_s=args.heartbeat_load_timeout_s,
        safety_factor=args.heartbeat_safety_factor,
        min_timeout_s=args.heartbeat_min_timeout_s,
        interrupt_grace_s=args.hang_interrupt_grace_s,
    )
    monitor = HeartbeatMonitor(os.environ[HEARTBEAT_DIR_ENV], settings)
    if metrics is not None:
        metrics.last_step_ts = lambda: monitor.last_step_ts
    return KitElasticAgent(
        spec,
        config.logs_specs,  # type: ignore[arg-type]
        monitor=monitor,
        events=events,
        stacks_dir=os.environ[STACKS_DIR_ENV],
        shutdown_timeout=args.shutdown_timeout or 30,
        node_failures=NodeFailures(limit=args.node_failure_limit, window_s=args.node_failure_window_s),
        node_name=os.environ.get("POD_NAME", ""),
        rejoin_timeout_s=join_timeout if args.max_nodes > 1 else None,
        zygote=zygote,
        node_actions=NodeActions(
            events=events,
            env=os.environ,
            folder=lambda: os.environ.get(HEARTBEAT_DIR_ENV),
            drain=lambda: pod.drain_pod(pod.grace_period_s()),
        ),
    )


@dataclass(frozen=True)
class _Ending:
    """How this launcher ends: its exit code and one-line reason, and whether it closes the rendezvous (with
    the run's outcome recorded first: `rendezvous/outcome.py`)."""

    code: int
    reason: str
    close: bool = True
    """False for a signalled node (as torchrun), a node given up (the others go on with a spare) and a pod
    that found the rendezvous closed already (the closer's record stands)."""


def _run_to_the_end(
    args: LaunchArgs, agent: KitElasticAgent, spec: WorkerSpec, events: EventLog, *, join_timeout: float
) -> tuple[int, str]:
    """Run the agent and judge how it ended (`_run_and_judge`); then the rendezvous is closed with the
    run's outcome recorded, or left open (`_close_rendezvous`), also when the launcher stops on an error."""
    try:
        ending = _run_and_judge(args, agent, spec, events, join_timeout=join_timeout)
    except BaseException as exc:
        code = exitcodes.FATAL_CONFIG if isinstance(exc, internals.TorchInternalsChanged) else 1
        ending = _Ending(code, f"the launcher stopped on {type(exc).__name__}: {exc}")
        raise
    finally:
        _close_rendezvous(args, agent, spec, ending)
    return ending.code, ending.reason


def _run_and_judge(
    args: LaunchArgs, agent: KitElasticAgent, spec: WorkerSpec, events: EventLog, *, join_timeout: float
) -> _Ending:
    """Run the agent (a spare first waits warm for a node to replace); a signal or a failed rendezvous ends
    it here."""
    spare = args.rdzv_backend != "static" and rendezvous.is_spare(args.node_rank, args.max_nodes)
    try:
        if spare:
            log.info("kit-launch: node %d is a hot spare: waiting warm for a node to replace", args.node_rank)
            events.emit("spare_waiting", node_rank=args.node_rank)
            if args.rdzv_backend == "c10d":  # the kit's handler waits for the first round itself
                wait_for_first_round(spec.rdzv_handler, join_timeout)
        result = agent.run()
    except SignalException as exc:
        log.error("kit-launch: got %s; workers stopped", exc.sigval.name)
        return _Ending(128 + int(exc.sigval), f"signal {exc.sigval.name}", close=False)
    except RendezvousError as exc:
        return _rendezvous_ended(args, agent, spec, events, exc)
    return _outcome(args, agent, spec, result, events)


def _rendezvous_ended(
    args: LaunchArgs, agent: KitElasticAgent, spec: WorkerSpec, events: EventLog, exc: RendezvousError
) -> _Ending:
    """The rendezvous failed, or was found closed: by a failed run (exit RUN_FAILED), or before this pod
    was needed (exit 0)."""
    closed = isinstance(exc, RendezvousClosedError)
    if closed:
        how = "before this pod was needed" if agent.attempt < 0 else "while this node re-joined"
        if (failed := _closed_by_a_failure(spec, how)) is not None:
            return failed
    if closed and agent.attempt < 0:
        message = "the job finished before this pod was needed (rendezvous closed)"
        log.info("kit-launch: %s; exiting 0", message)
        events.emit("spare_exit", reason=message)
        return _Ending(exitcodes.OK, message, close=False)
    message = f"rendezvous failed: {type(exc).__name__}: {exc}"
    log.error("kit-launch: %s; exiting %d", message, exitcodes.BUDGET_EXHAUSTED)
    return _Ending(exitcodes.BUDGET_EXHAUSTED, message, close=not closed)


def _closed_by_a_failure(spec: WorkerSpec, how: str) -> _Ending | None:
    """The exit of a pod that found the rendezvous closed by a failed run, None if the run finished (or its
    outcome is unknown: torch's meaning of a closed rendezvous). Exiting 0 would mark this index succeeded
    and let the Job succeed with the run failed; RUN_FAILED fails the Job (its pod failure policy)."""
    handler = spec.rdzv_handler
    record = handler.recorded_outcome() if isinstance(handler, RecordsOutcome) else None
    if record is None or record.finished:
        return None
    message = f"the run failed {how}: {record.describe()}"
    log.error(
        "kit-launch: %s; exiting %d: the Job fails (a new pod cannot help)", message, exitcodes.RUN_FAILED
    )
    return _Ending(exitcodes.RUN_FAILED, message, close=False)


def _close_rendezvous(args: LaunchArgs, agent: KitElasticAgent, spec: WorkerSpec, ending: _Ending) -> None:
    """Close the job's rendezvous at the end (peers then leave their next round at once), after recording
    why (finished, or failed with the exit code and reason: a pod that finds it closed reads it), unless
    this node was signalled, given up or found it closed; then this node only departs the kit's rendezvous
    (`depart`), so the next round need not wait for its expiry."""
    agent.exits.close()
    handler = spec.rdzv_handler
    if ending.close and agent.given_up is None:  # a node given up: the others go on (with a spare)
        if isinstance(handler, RecordsOutcome):
            pod_name = os.environ.get("POD_NAME")
            closed_by = f"node {args.node_rank}" + (f" (pod {pod_name})" if pod_name else "")
            finished = ending.code == exitcodes.OK
            handler.record_outcome(
                RunOutcome(finished=finished, code=ending.code, reason=ending.reason, closed_by=closed_by)
            )
        handler.shutdown()
    elif isinstance(handler, rendezvous.KitRendezvous):
        handler.depart()  # drained, given up, signalled or closed: the next round need not wait


def _outcome(
    args: LaunchArgs, agent: KitElasticAgent, spec: WorkerSpec, result: RunResult | None, events: EventLog
) -> _Ending:
    """The exit code and reason for how the agent's run ended."""
    if result is None:  # agent.run() swallowed RendezvousGracefulExitError: a spare found it closed
        if (failed := _closed_by_a_failure(spec, "before this hot spare was needed")) is not None:
            return failed
        message = "hot spare not needed: the job finished (rendezvous closed)"
        log.info("kit-launch: %s; exiting 0", message)
        events.emit("spare_exit", reason=message)
        return _Ending(exitcodes.OK, message, close=False)
    # Only SUCCEEDED means every worker finished: the inherited loop also returns an UNHEALTHY result (a hang)
    # when no restart is left, and `RunResult.is_failed()` is False for it.
    if result.state == WorkerState.SUCCEEDED:
        log.info("kit-launch: workers finished after %d restart(s); exiting 0", max(agent.attempt, 0))
        return _Ending(exitcodes.OK, "workers finished")
    if agent.given_up is not None:
        message = f"node given up: {agent.given_up}"
        log.error("kit-launch: %s; exiting %d", message, exitcodes.BUDGET_EXHAUSTED)
        return _Ending(exitcodes.BUDGET_EXHAUSTED, message, close=False)
    if agent.fatal:
        message = f"fatal config error in a worker ({agent.last_failure}); not retried"
        log.error("kit-launch: %s; exiting %d", message, exitcodes.FATAL_CONFIG)
        return _Ending(exitcodes.FATAL_CONFIG, message)
    message = (
        f"restart budget exhausted (--max-restarts={args.max_restarts}); last failure: {agent.last_failure}; "
        "raise --max-restarts or fix the cause"
    )
    log.error("kit-launch: %s; exiting %d", message, exitcodes.BUDGET_EXHAUSTED)
    return _Ending(exitcodes.BUDGET_EXHAUSTED, message)
