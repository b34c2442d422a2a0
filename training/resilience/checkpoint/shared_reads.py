"""Reads from the shared tier, counted (every `resume` event says how many bytes it read there) and, for
benchmarks, throttled (`checkpoint.shared_read_mib_s`).

Why a throttle: on the CPU test machines a restore from "shared storage" reads a local disk through the
page cache, at memory speed, so a benchmark would find memory tiers pointless. On EKS every node reads
the same FSx for Lustre file system at its aggregate throughput divided over the nodes that restore at
once; the benchmark sets each rank's cap to its share of that (bench.tiers derives it from cdk.json).
The same reader runs either way; only the pace differs.

A file that this process has just read whole (resume verifies a rank's own shard before DCP loads it) is
in the node's page cache for the load that follows; the emulation reads it again uncapped and counts it
as cached, not as a second read from the file system.
"""

from __future__ import annotations

import io
import os
import threading
import time
from pathlib import Path

MIB = 1 << 20


class SharedReads:
    """This process's reads from shared storage: bytes and an optional pace (bytes per second)."""

    def __init__(self) -> None:
        self.bytes = 0
        """Bytes read from the shared tier since the process started."""
        self.cached_bytes = 0
        """Bytes read again from a file this process had just read whole (the page cache's)."""
        self._rate = 0.0
        self._due = 0.0
        self._whole: set[str] = set()
        self._lock = threading.Lock()

    def cap(self, mib_s: float) -> None:
        """Pace every later read at `mib_s` MiB/s (0: as fast as the storage goes)."""
        self._rate = mib_s * MIB

    def read_whole(self, path: os.PathLike[str] | str) -> None:
        """`path` was just read from start to end by this process (its pages are cached)."""
        with self._lock:
            self._whole.add(os.fspath(path))

    def account(self, path: str, nbytes: int) -> None:
        """`nbytes` were read from `path`: count them, and sleep as long as the pace wants."""
        if nbytes <= 0:
            return
        with self._lock:
            if path in self._whole:
                self.cached_bytes += nbytes
                return
            self.bytes += nbytes
            if not self._rate:
                return
            now = time.monotonic()
            self._due = max(self._due, now) + nbytes / self._rate
            delay = self._due - now
        if delay > 0:
            time.sleep(delay)

    def forget_cached(self) -> None:
        """Start again with a cold cache (a new restore: the page cache may have dropped the files)."""
        with self._lock:
            self._whole.clear()


SHARED_READS = SharedReads()
"""The process's one meter: the checkpointer sets its cap, resume and the DCP reader report to it."""


class MeteredRaw(io.RawIOBase):
    """A file's raw reads, reported to SHARED_READS (DCP's reader reads shards through it)."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "rb", buffering=0)  # noqa: SIM115  (closed by close())
        self._path = os.fspath(path)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def, override]
        n = self._file.readinto(buffer)
        SHARED_READS.account(self._path, n or 0)
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        self._file.close()
        super().close()
