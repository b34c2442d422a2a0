"""A worker's side of the launcher's hang probe: every thread's Python stack, written on request.

The kit launcher tells a hung rank from the peers that wait for it by where each one's main thread is
(training/launcher/blame.py). On STACK_SIGNAL, faulthandler writes every thread's stack to a file the
launcher names, from C, so it works while the main thread is blocked in gloo or NCCL. `install` is called
by the zygote and the trainer; it does nothing outside the kit launcher. Standard library only.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
from pathlib import Path
from typing import TextIO

from fsdpkit.contracts import env

STACKS_DIR_ENV = env.STACKS_DIR
STACK_SIGNAL = signal.SIGUSR2

_stack_file: TextIO | None = None


def stack_path(directory: str | os.PathLike[str], rank: int, pid: int) -> Path:
    return Path(directory) / f"rank_{rank}_{pid}.txt"


def install() -> None:
    """In a worker: dump every thread's stack to the launcher's folder on STACK_SIGNAL. No-op without it."""
    global _stack_file
    directory, rank = os.environ.get(STACKS_DIR_ENV), os.environ.get("RANK")
    if not directory or rank is None or not rank.isdigit():
        return
    path = stack_path(directory, int(rank), os.getpid())
    if _stack_file is not None and _stack_file.name == str(path):
        return
    try:
        stream = open(path, "w", encoding="utf-8")  # noqa: SIM115 - held open for the signal handler
    except OSError:
        return  # no dump; the launcher falls back to the stalest heartbeat
    stream.write(f"main thread 0x{threading.main_thread().ident:016x}\n")
    stream.flush()
    faulthandler.register(STACK_SIGNAL, file=stream, all_threads=True, chain=False)
    _stack_file = stream
