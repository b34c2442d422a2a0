"""The worker processes the agent started, read without reaping them (torchelastic still collects them).

A failed worker's live peers are SIGKILLed before torchelastic sees the failure, torn error files are moved
aside before torch's reader raises on them, and exit times are kept to the millisecond (`ExitClock`), so the
first failure of a group is the one reported.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Callable
from typing import Any, Literal

from torch.distributed.elastic.agent.server.api import RunResult

from fsdpkit.contracts import exitcodes
from fsdpkit.launcher.blame import ExitClock
from fsdpkit.runtime.error_file import held_parse_failures, set_aside_if_torn

log = logging.getLogger("kit.launch")

ExitState = Literal["running", "clean", "failed", "reaped"]
WorkerStates = dict[int, tuple[int, ExitState]]
"""Local rank -> (pid, `peek_exit`) of every process the agent started (shims under the zygote)."""


def peek_exit(pid: int) -> ExitState:
    """A worker's state, read without reaping (WNOWAIT: torchelastic still collects the exit). Clean: 0, or
    DRAINED after a committed drain; reaped: torchelastic has already collected it."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return "reaped"
    if info is None:
        return "running"
    clean = info.si_code == os.CLD_EXITED and info.si_status in (exitcodes.OK, exitcodes.DRAINED)
    return "clean" if clean else "failed"


def describe_exit(code: int) -> str:
    """'exit code 1' or 'signal SIGKILL (-9)'."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name} ({code})"
        except ValueError:
            return f"signal {-code} ({code})"
    return f"exit code {code}"


class WorkerExits:
    """The agent's worker processes: their states, their exit times, and torchelastic's check made safe."""

    def __init__(self, processes: Callable[[], Any]) -> None:
        """`processes` returns torchelastic's process context (`pids()`, `error_files`), None before the
        first start."""
        self._processes = processes
        self.clock = ExitClock()

    def states(self) -> WorkerStates:
        pcontext = self._processes()
        pids = {} if pcontext is None else pcontext.pids()
        return {local_rank: (pid, peek_exit(pid)) for local_rank, pid in pids.items()}

    def kill_peers_of_a_failed_worker(self, states: WorkerStates) -> None:
        """A worker exited with an error: SIGKILL its live peers now, before torchelastic sees it.

        torchelastic answers a failure by SIGTERMing the other workers and waiting up to 30 s for them; a
        trainer takes SIGTERM as a drain request (it runs on to the next step boundary, which a broken
        collective never reaches), so every failure would cost 30 s."""
        if any(state == "failed" for _, state in states.values()):
            for pid in (pid for pid, state in states.values() if state == "running"):
                with contextlib.suppress(ProcessLookupError):  # a shim's worker dies with it (the zygote
                    os.kill(pid, signal.SIGKILL)  # kills the group of a lost shim)

    def stock_check(self, check: Callable[[], RunResult], states: WorkerStates) -> RunResult:
        """torchelastic's check (`check`), safe from torn error files.

        torch's reader raises on a failed worker's error file that is not whole JSON (a trainer of one's
        own stopped while writing it), which would crash the launcher. Such files of exited workers are
        moved aside first, and again if torch raised on one that appeared meanwhile (a peer that exited
        while torch was stopping the group; the traceback torch logs before raising is held and dropped);
        the failure is then reported by its exit code."""
        self.set_aside_torn_error_files(states)
        while True:
            with held_parse_failures() as torch_tracebacks:
                try:
                    return check()
                except (ValueError, KeyError, TypeError):  # what json.load and torch's field reads raise
                    if not self.set_aside_torn_error_files():
                        raise
                    torch_tracebacks.drop()  # our line says it

    def set_aside_torn_error_files(self, states: WorkerStates | None = None) -> bool:
        """Move aside the torn error files of workers that are no longer running (per `states`, read now
        when not given); True if one was."""
        pcontext = self._processes()
        error_files: dict[int, str] = {} if pcontext is None else pcontext.error_files
        states = self.states() if states is None else states
        moved = False
        for local_rank, path in sorted(error_files.items()):
            if local_rank in states and states[local_rank][1] == "running":
                continue  # it may still be writing the file
            where = set_aside_if_torn(path)
            if where is not None:
                moved = True
                log.warning(
                    "kit-launch: local rank %d left an error file that is not whole JSON (stopped while "
                    "writing it?); %s; its failure is reported by its exit code",
                    local_rank,
                    where,
                )
        return moved

    def watch(self, pids: list[int]) -> None:
        """Time the exits of a new group's processes."""
        self.clock.watch(pids)

    def exit_time(self, pid: int) -> float | None:
        return self.clock.exit_time(pid)

    def close(self) -> None:
        self.clock.close()
