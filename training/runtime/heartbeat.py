"""Worker-side heartbeat client: tells the launcher that this rank is still making progress.

Protocol (kit launcher): the launcher sets KIT_HEARTBEAT_DIR; the worker rewrites `<dir>/rank_<RANK>.json`
in place on every beat and phase change with {"seq", "pid", "rank", "step", "phase", "since", "ts",
"rhythm", "n", "recent", "interruptible", "seq_end"}:
- `phase`: what the rank does now; `since`: when it entered it; `ts`: this write (unix seconds);
- `rhythm`: true once the rank has beaten in "train" since it entered it (the first step after a load
  still gets the load allowance);
- `n`, `recent`: how many step times this process measured, and the last few (seconds). A step time is
  beat to beat, or beat to a "checkpoint" announcement (the save is not counted as training); a
  launcher that polls slower than the steps still learns every step;
- `interruptible`: the training thread takes the launcher's hang interrupt now
(fsdpkit.runtime.hang_interrupt);
- `seq`, `seq_end`: the write's number, first and last. One `pwrite` at offset 0 of a file opened once,
  padded with spaces to a fixed width: no truncation and no rename, which on ext4 start write-back of the
  file's data (a temp file renamed over the record cost 1-3 ms a beat on the test VM's /tmp, the bulk of
  the API's cost per step; in place ~2 us). A reader that catches a write half done sees no JSON or
  seq != seq_end and keeps what it knew (`read_record`).
The launcher applies the load allowance in "start", "load", "checkpoint" and before the rhythm, the
(learned) step timeout in "train", and never treats "done" as a hang.

Trainer usage: `phase("start")` at start, `phase("load")` before reading a checkpoint,
`phase("train")` after it, `phase("checkpoint")` before any call that may block on a checkpoint
(`maybe_save` on a save step, or on every step: it is one small write), and `beat(step)` after each
step (it returns the rank to "train"); `close()` at the end. A wait on a checkpoint in the middle of a
step (an optimizer step that waits for the host copy of the previous save) runs inside
`checkpoint_wait()`: the "checkpoint" phase for as long as it lasts, then back to the phase before, with
the wait left out of the step time (the Checkpointer calls it around every wait, as `on_wait`).

Beats come from the training (main) thread on purpose: a background thread would keep beating while
the training thread is stuck.

Under NVRx's ft_launcher (FT_RANK_MONITOR_IPC_SOCKET set) the same calls go to its
RankMonitorClient: it is connected on the first beat (it needs the process group) and gets a
heartbeat per beat; phases are not sent because 0.4.1's heartbeat protocol has none. With neither
launcher (env unset) every call is a no-op.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from fsdpkit.contracts import env

Phase = Literal["start", "load", "train", "checkpoint", "done"]
PHASES: tuple[str, ...] = ("start", "load", "train", "checkpoint", "done")
HEARTBEAT_DIR_ENV = env.HEARTBEAT_DIR
NVRX_SOCKET_ENV = "FT_RANK_MONITOR_IPC_SOCKET"
RECENT_INTERVALS = 16
RECORD_BYTES = 1024
"""A record is padded to at least this width (a full one is ~600 bytes), so a shorter one never leaves the
tail of a longer one behind it."""


def heartbeat_path(directory: str | os.PathLike[str], rank: int) -> Path:
    """The file a rank beats into; the launcher reads the same name."""
    return Path(directory) / f"rank_{rank}.json"


def read_record(directory: str | os.PathLike[str], rank: int) -> dict[str, Any] | None:
    """The rank's last complete record; None when there is none yet or the read caught a write half done."""
    try:
        record = json.loads(heartbeat_path(directory, rank).read_bytes())
    except (FileNotFoundError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("seq") != record.get("seq_end"):
        return None
    return record


class HeartbeatClient:
    """One per worker process; cheap enough to call every step (one small file write)."""

    def __init__(self, *, directory: str | os.PathLike[str] | None, rank: int, nvrx: bool = False) -> None:
        path = heartbeat_path(directory, rank) if directory else None
        self._fd = (
            os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644) if path else None
        )
        self._width = RECORD_BYTES
        self._seq = 0
        self._rank = rank
        self._nvrx = nvrx
        self._nvrx_client: Any = None
        self._phase: str = "start"
        self._since = time.time()
        self._step: int | None = None
        self._mark: float | None = None  # the last beat, while the rank keeps a training rhythm
        self._intervals = 0
        self._recent: deque[float] = deque(maxlen=RECENT_INTERVALS)
        self._closed = False
        self._interruptible = False
        self._write()

    @classmethod
    def from_env(cls) -> HeartbeatClient:
        """The client for the launcher this process runs under (kit, NVRx ft_launcher, or none)."""
        rank = int(os.environ.get("RANK", "0"))
        directory = os.environ.get(HEARTBEAT_DIR_ENV) or None
        nvrx = directory is None and bool(os.environ.get(NVRX_SOCKET_ENV))
        return cls(directory=directory, rank=rank, nvrx=nvrx)

    @property
    def enabled(self) -> bool:
        return self._fd is not None or self._nvrx

    def phase(self, phase: Phase) -> None:
        """Announce a phase with its own allowance (e.g. "load" while a checkpoint is read).

        A non-train phase lasts until the next `beat()`, which returns the rank to "train".
        """
        if phase not in PHASES:
            raise ValueError(f"heartbeat phase {phase!r} is not one of {', '.join(PHASES)}")
        if self._closed:
            return
        now = time.time()
        if self._mark is not None and phase == "checkpoint":
            self._record(now - self._mark)  # the training part of the step in progress
        if phase != self._phase or phase == "train":
            self._since = now
        self._phase = phase
        self._mark = None
        self._write(now)

    @contextlib.contextmanager
    def checkpoint_wait(self) -> Iterator[None]:
        """The "checkpoint" phase while the training thread waits on a checkpoint, then the phase it was
        in; the wait is not counted in the step time (the rhythm of "train" is kept)."""
        if self._closed or self._phase == "checkpoint":
            yield
            return
        before, t0 = self._phase, time.time()
        self._phase, self._since = "checkpoint", t0
        self._write(t0)
        try:
            yield
        finally:
            now = time.time()
            if not self._closed:
                self._phase, self._since = before, now
                if self._mark is not None:
                    self._mark += now - t0
                self._write(now)

    def beat(self, step: int) -> None:
        """One beat per completed training step."""
        if self._closed:
            return
        now = time.time()
        if self._mark is not None and self._step is not None and step > self._step:
            self._record((now - self._mark) / (step - self._step))
        if self._phase != "train":
            self._phase = "train"
            self._since = now
        self._mark = now
        self._step = step
        self._write(now)
        if self._nvrx:
            self._nvrx_beat()

    def interruptible(self, value: bool) -> None:
        """Say whether a hang of this rank may be interrupted in place
        (fsdpkit.runtime.hang_interrupt.armed)."""
        if value != self._interruptible and not self._closed:
            self._interruptible = value
            self._write()

    def close(self) -> None:
        """Final write with phase "done"; later silence is not a hang."""
        if self._closed:
            return
        self.phase("done")
        self._closed = True
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._nvrx_client is not None:
            self._nvrx_client.shutdown_workload_monitoring()
            self._nvrx_client = None

    def _record(self, seconds: float) -> None:
        self._intervals += 1
        self._recent.append(round(seconds, 6))

    def _write(self, now: float | None = None) -> None:
        if self._fd is None:
            return
        self._seq += 1
        record = {
            "seq": self._seq,
            "pid": os.getpid(),
            "rank": self._rank,
            "step": self._step,
            "phase": self._phase,
            "since": self._since,
            "ts": now if now is not None else time.time(),
            "rhythm": self._mark is not None,
            "n": self._intervals,
            "recent": list(self._recent),
            "interruptible": self._interruptible,
            "seq_end": self._seq,
        }
        data = json.dumps(record).encode()
        self._width = max(self._width, len(data))
        os.pwrite(self._fd, data.ljust(self._width), 0)

    def _nvrx_beat(self) -> None:
        if self._nvrx_client is None:
            # Imported lazily: NVRx is an optional benchmark dependency, never needed by the kit.
            from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

            client = RankMonitorClient()
            client.init_workload_monitoring()
            self._nvrx_client = client
        self._nvrx_client.send_heartbeat()
