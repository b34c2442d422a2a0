"""Which rank failed first: the others die of (or wait in) the broken collective after it.

Two kinds of evidence, both taken by the launcher without trusting the workers' own story:

- **Exits** (`ExitClock`): torchelastic stamps a failure with whole seconds, and only when it polls, so a
  killed rank and the peer that dies of the broken collective 50 ms later look simultaneous. A thread
  here waits on a pidfd per worker (it wakes the moment the process exits, without reaping it) and
  records the time to the millisecond. The earliest exit is the first failure.
- **Hangs** (`probe`): a hung rank and its peers all stop beating, within a step of each other. The peers
  are blocked inside a collective waiting for it; the hung rank is somewhere else (or SIGSTOPped). On
  request each worker's faulthandler writes every thread's Python stack to a file, from C, so it works
  while the main thread is blocked in gloo or NCCL (training/runtime/stacks.py, installed in every worker).
  A rank whose main thread is not in `torch.distributed` now, or that is stopped, is the one that hung.
  "Now" is the innermost frames: torch.distributed frames further out (torchelastic's `@record` around
  the trainer's `main`, a DCP call into the program's own code) say nothing about where it waits.

Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import sysconfig
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fsdpkit.runtime.stacks import STACK_SIGNAL, stack_path

TORCH_PATH = f"{os.sep}torch{os.sep}"
COLLECTIVE_PATH = f"{TORCH_PATH}distributed{os.sep}"
"""A frame under this path among the main thread's innermost library frames means the rank waits in a
collective (FSDP hooks, c10d, DCP)."""
_STDLIB = tuple({sysconfig.get_paths()[key] + os.sep for key in ("stdlib", "platstdlib")})
_THIRD_PARTY = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


@dataclass(frozen=True, kw_only=True)
class Probe:
    """Where a silent rank's main thread is."""

    rank: int
    state: str
    """"stopped" (SIGSTOP), "collective" (waits in torch.distributed), "elsewhere", or "unknown"."""
    where: str = ""
    """The innermost frame of the main thread, e.g. "faults.py:283 in _act"."""


_THREAD = re.compile(r"^(?:Current thread|Thread) (?P<id>0x[0-9a-f]+) ")
_FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>.+)$')


def probe(directory: str | os.PathLike[str], rank: int, pid: int, *, timeout_s: float = 1.0) -> Probe:
    """Ask one worker for its stacks (only if it installed the dump: the signal would kill it otherwise)."""
    if _process_state(pid) in ("T", "t"):
        return Probe(rank=rank, state="stopped", where="stopped by a signal")
    path = stack_path(directory, rank, pid)
    try:
        before = path.stat().st_size
        os.kill(pid, STACK_SIGNAL)
    except OSError:
        return Probe(rank=rank, state="unknown")
    text = _read_new(path, before, timeout_s)
    main = re.search(r"^main thread (0x[0-9a-f]+)$", path.read_text(encoding="utf-8", errors="replace"), re.M)
    frames = _main_thread_frames(text, main.group(1) if main else "")
    if not frames:
        return Probe(rank=rank, state="unknown")
    path_top, line, func = frames[0]
    where = f"{os.path.basename(path_top)}:{line} in {func}"
    waiting = waits_in_collective([frame[0] for frame in frames])
    return Probe(rank=rank, state="collective" if waiting else "elsewhere", where=where)


def waits_in_collective(paths: list[str]) -> bool:
    """Whether the innermost frames (`paths`, innermost first) are a torch.distributed call.

    Walking outward through torch's and the standard library's own frames (`torch.ops` dispatch,
    `threading` waits) a torch.distributed frame means the rank waits in a collective; the first frame
    of any other code (the trainer, a fault's sleep) means it is busy or stuck there, whatever calls it.
    """
    for path in paths:
        if COLLECTIVE_PATH in path:
            return True
        if not _is_library(path):
            return False
    return False


def _is_library(path: str) -> bool:
    """torch's or the standard library's own code (frames a collective's wait passes through)."""
    if TORCH_PATH in path or path.startswith("<frozen "):
        return True
    return path.startswith(_STDLIB) and not any(part in path for part in _THIRD_PARTY)


def culprit(probes: list[Probe], *, default: int) -> int:
    """The rank that hung: stopped first, then outside any collective, else `default` (the stalest heartbeat).

    Where several ranks share the deciding state (two outside any collective: one may wait on a store or
    an event, which has no Python frame of torch.distributed), `default` wins among them, else the first."""
    for state in ("stopped", "elsewhere"):
        ranks = [item.rank for item in probes if item.state == state]
        if ranks:
            return default if default in ranks else ranks[0]
    return default


def _process_state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return ""
    return stat.rpartition(")")[2].split()[0] if ")" in stat else ""


def _read_new(path: Path, offset: int, timeout_s: float) -> str:
    """What the worker appended after `offset`, once it stops growing (deadline poll)."""
    deadline = time.monotonic() + timeout_s
    size, stable = offset, 0
    while time.monotonic() < deadline and stable < 2:
        time.sleep(0.01)
        now = path.stat().st_size
        stable = stable + 1 if now == size and now > offset else 0
        size = now
    with open(path, encoding="utf-8", errors="replace") as fh:
        fh.seek(offset)
        return fh.read()


def _main_thread_frames(text: str, main_id: str) -> list[tuple[str, str, str]]:
    """Frames (path, line, function) of the main thread's section, innermost first."""
    frames: list[tuple[str, str, str]] = []
    inside = False
    for line in text.splitlines():
        header = _THREAD.match(line)
        if header:
            inside = header["id"] == main_id
            continue
        match = _FRAME.match(line)
        if inside and match:
            frames.append((match["path"], match["line"], match["func"]))
    return frames


class ExitClock:
    """Exit times of worker processes to the millisecond, from pidfds watched by one daemon thread."""

    def __init__(self) -> None:
        self._times: dict[int, float] = {}
        self._fds: dict[int, int] = {}  # pidfd -> pid
        self._lock = threading.Lock()
        self._poll = select.poll()
        self._wake_r, self._wake_w = os.pipe()
        self._poll.register(self._wake_r, select.POLLIN)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kit-exit-clock", daemon=True)
        self._thread.start()

    def watch(self, pids: list[int]) -> None:
        """Start timing these processes (a new worker group); forgets the old ones."""
        with self._lock:
            for fd in list(self._fds):
                self._forget(fd)
            self._times.clear()
            for pid in pids:
                try:
                    fd = os.pidfd_open(pid)
                except OSError:  # already reaped, or no pidfd support: no time for this one
                    continue
                self._fds[fd] = pid
                self._poll.register(fd, select.POLLIN)
        os.write(self._wake_w, b"x")

    def exit_time(self, pid: int) -> float | None:
        with self._lock:
            return self._times.get(pid)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for fd in list(self._fds):
                self._forget(fd)
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=1)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _forget(self, fd: int) -> None:
        self._fds.pop(fd, None)
        with contextlib.suppress(KeyError, ValueError):
            self._poll.unregister(fd)
        with contextlib.suppress(OSError):
            os.close(fd)

    def _run(self) -> None:
        while True:
            ready = self._poll.poll()
            now = time.time()
            with self._lock:
                if self._closed:
                    return
                for fd, _ in ready:
                    if fd == self._wake_r:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 64)
                        continue
                    pid = self._fds.get(fd)
                    if pid is not None:
                        self._times.setdefault(pid, now)
                        self._forget(fd)
