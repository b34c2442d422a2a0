"""Runs the kit's elastic agent the way torchrun's `launch_agent` runs the stock one, and maps the
outcome to the kit's exit codes.

`launch_agent` hard-codes `LocalElasticAgent`, so this builds the same WorkerSpec (rendezvous handler
from the registry, torchrun's LaunchConfig defaults) around `KitElasticAgent`, and closes the
rendezvous at the end unless the launcher was signalled (as `launch_agent` does): peers then leave
their next rendezvous at once instead of waiting for its timeout. A node that was given up leaves it open
too (the others go on with a spare), and a spare that was never needed exits 0
(training/launcher/rendezvous/).
"""

from __future__ import annotations

import logging
import os

from torch.distributed.elastic.agent.server.api import RunResult, WorkerSpec, WorkerState
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters
from torch.distributed.elastic.rendezvous.api import RendezvousClosedError, RendezvousError
from torch.distributed.launcher.api import LaunchConfig

from fsdpkit.contracts import exitcodes
from fsdpkit.launcher import rendezvous
from fsdpkit.launcher.agent import KitElasticAgent
from fsdpkit.launcher.args import LaunchArgs
from fsdpkit.launcher.monitor import HeartbeatMonitor, HeartbeatSettings
from fsdpkit.launcher.node_actions import NodeActions
from fsdpkit.launcher.node_failures import NodeFailures
from fsdpkit.launcher.rendezvous.c10d import KitOpExecutor, wait_for_first_round
from fsdpkit.launcher.zygote import Zygote, prewarm_modules, worker_command
from fsdpkit.runtime import pod
from fsdpkit.runtime import torch_internals as internals
from fsdpkit.runtime.events import EventLog
from fsdpkit.runtime.heartbeat import HEARTBEAT_DIR_ENV
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
    except (RendezvousError, RuntimeError, ValueError) as exc:
        message = rendezvous_setup_error(args.rdzv_endpoint, exc)
        log.error("kit-launch: error: %s", message)
        return exitcodes.USAGE, message
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


def _run_to_the_end(
    args: LaunchArgs, agent: KitElasticAgent, spec: WorkerSpec, events: EventLog, *, join_timeout: float
) -> tuple[int, str]:
    """Run the agent (a spare first waits warm for a node to replace); a signal or a failed rendezvous
    ends it here, then the rendezvous is closed or left open (`_close_rendezvous`)."""
    close_rendezvous = True
    result = None
    spare = args.rdzv_backend != "static" and rendezvous.is_spare(args.node_rank, args.max_nodes)
    try:
        if spare:
            log.info("kit-launch: node %d is a hot spare: waiting warm for a node to replace", args.node_rank)
            events.emit("spare_waiting", node_rank=args.node_rank)
            if args.rdzv_backend == "c10d":  # the kit's handler waits for the first round itself
                wait_for_first_round(spec.rdzv_handler, join_timeout)
        result = agent.run()
    except SignalException as exc:
        close_rendezvous = False  # as torchrun: a signalled node must not close the job's rendezvous
        log.error("kit-launch: got %s; workers stopped", exc.sigval.name)
        return 128 + int(exc.sigval), f"signal {exc.sigval.name}"
    except RendezvousError as exc:
        if isinstance(exc, RendezvousClosedError) and agent.attempt < 0:
            close_rendezvous = False
            message = "the job finished before this pod was needed (rendezvous closed)"
            log.info("kit-launch: %s; exiting 0", message)
            events.emit("spare_exit", reason=message)
            return exitcodes.OK, message
        message = f"rendezvous failed: {type(exc).__name__}: {exc}"
        log.error("kit-launch: %s; exiting %d", message, exitcodes.BUDGET_EXHAUSTED)
        return exitcodes.BUDGET_EXHAUSTED, message
    finally:
        _close_rendezvous(agent, spec, close=close_rendezvous)
    return _outcome(args, agent, result, events)


def _close_rendezvous(agent: KitElasticAgent, spec: WorkerSpec, *, close: bool) -> None:
    """Close the job's rendezvous at the end (peers then leave their next round at once), unless this node
    was signalled or given up; then this node only departs the kit's rendezvous (`depart`), so the next
    round need not wait for its expiry."""
    agent.exits.close()
    if agent.given_up is not None:
        close = False  # the others go on (with a spare); closing would end them all
    if close:
        spec.rdzv_handler.shutdown()
    elif isinstance(spec.rdzv_handler, rendezvous.KitRendezvous):
        spec.rdzv_handler.depart()  # drained, given up or signalled: the next round need not wait


def _outcome(
    args: LaunchArgs, agent: KitElasticAgent, result: RunResult | None, events: EventLog
) -> tuple[int, str]:
    """The exit code and reason for how the agent's run ended."""
    if result is None:  # agent.run() swallowed RendezvousGracefulExitError: a spare, never needed
        message = "hot spare not needed: the job finished (rendezvous closed)"
        log.info("kit-launch: %s; exiting 0", message)
        events.emit("spare_exit", reason=message)
        return exitcodes.OK, message
    # Only SUCCEEDED means every worker finished: the inherited loop also returns an UNHEALTHY result (a hang)
    # when no restart is left, and `RunResult.is_failed()` is False for it.
    if result.state == WorkerState.SUCCEEDED:
        log.info("kit-launch: workers finished after %d restart(s); exiting 0", max(agent.attempt, 0))
        return exitcodes.OK, "workers finished"
    if agent.given_up is not None:
        message = f"node given up: {agent.given_up}"
        log.error("kit-launch: %s; exiting %d", message, exitcodes.BUDGET_EXHAUSTED)
        return exitcodes.BUDGET_EXHAUSTED, message
    if agent.fatal:
        message = f"fatal config error in a worker ({agent.last_failure}); not retried"
        log.error("kit-launch: %s; exiting %d", message, exitcodes.FATAL_CONFIG)
        return exitcodes.FATAL_CONFIG, message
    message = (
        f"restart budget exhausted (--max-restarts={args.max_restarts}); last failure: {agent.last_failure}; "
        "raise --max-restarts or fix the cause"
    )
    log.error("kit-launch: %s; exiting %d", message, exitcodes.BUDGET_EXHAUSTED)
    return exitcodes.BUDGET_EXHAUSTED, message
