"""A hung training thread, interrupted in place: the launcher's first answer to a hang when the trainer
restarts in process (the kit backend of training/resilience/inprocess.py).

The launcher (training/launcher/hang.py) finds a rank silent past its heartbeat timeout and blames it
(training/launcher/blame.py). If that rank's beats say it is interruptible, the launcher sends it
INTERRUPT_SIGNAL instead of restarting the group. The handler raises `HangInterrupted` in the training
thread between two bytecodes, so a hang at Python level (a sleep, a lock, a loop waiting on something
that never comes) becomes an ordinary exception: the in-process restart recovers the rank, and its peers,
whose collectives with it fail when it aborts its groups, in about a second and from the live state,
where a group restart starts new processes and reads the checkpoint back. This is NVRx in-process
restart's soft timeout (an asynchronous exception in the main thread), driven by the kit's own heartbeat.

A thread stuck in C (a CUDA kernel, a gloo or NCCL wait) never runs a Python handler: the launcher waits
its grace (`--hang-interrupt-grace`) for the rank's next beat, then restarts the group as before.

The handler is armed only while the train loop runs, and fires once per arming: during a restart, the
final save or a drain, a late signal is logged and ignored. Once installed it stays installed (a signal
sent just as the loop ended must not kill the process with the signal's default action).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Protocol

INTERRUPT_SIGNAL = signal.SIGUSR1
"""What the launcher sends a hung, interruptible rank (the shim forwards it under the zygote too)."""


class HangInterrupted(RuntimeError):
    """The launcher found this rank hung and interrupted its training thread."""


class _Announces(Protocol):
    def interruptible(self, value: bool) -> None: ...


_armed = False
_installed = False


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _armed
    if not _armed:
        print("[inprocess] hang interrupt outside the train loop: ignored", file=sys.stderr, flush=True)
        return
    _armed = False  # once per arming: a second signal must not land in the restart that this one starts
    raise HangInterrupted(
        "the launcher found this rank hung (no heartbeat past its timeout) and interrupted it"
    )


@contextlib.contextmanager
def armed(heartbeat: _Announces) -> Iterator[None]:
    """Let the launcher interrupt the training thread for the duration of the block, and say so in the
    beats. Main thread only (Python runs signal handlers there); elsewhere a no-op."""
    global _armed, _installed
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if not _installed:
        signal.signal(INTERRUPT_SIGNAL, _on_signal)
        _installed = True
    _armed = True
    heartbeat.interruptible(True)
    try:
        yield
    finally:
        _armed = False
        heartbeat.interruptible(False)
