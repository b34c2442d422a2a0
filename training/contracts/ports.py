"""Free TCP ports for a round's stores (no torch import: the launcher and the local runner use it too).

Rank 0 of a round hosts the job's TCPStore on MASTER_PORT, and under the NVRx backend two more stores on
MASTER_PORT+1 (each Wrapper iteration's) and MASTER_PORT+2 (the Wrapper's own). torch picks MASTER_PORT
as any free port and checks neither of the next two. Seen under load: one of them was a client socket's
local port (ephemeral ports are allocated from the same range): rank 0 failed to bind it (EADDRINUSE), rank
1 blocked in C for 45 s connecting to it, and NVRx's hard timeout killed rank 1, a false restart.
`free_port_run` returns a port whose whole run is free at the time of the call. Nothing reserves it after
that; the window left is a worker's start-up, not the whole job.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterable, Iterator

STORE_PORTS = 3
"""MASTER_PORT and the two after it (the NVRx backend's iteration store and Wrapper store)."""

# -- what the kit listens on (the run's NetworkPolicy admits only the run's own pods to these) -------------
# The fixed ports are the job's rendezvous port (the values' RDZV_PORT) and the two after it. Under the kit's
# rendezvous, rank 0's workers' store and the in-process restart store take ports the kernel picks
# (`free_port_run`, port 0), and gloo's and NCCL's pair sockets listen on kernel-picked ports too, so a
# policy that names ports must admit the whole ephemeral range as well; admitting the run's own pods on
# every TCP port is the simpler rule that covers the same. The kit serves no metrics endpoint: its metrics
# are pushed to the CloudWatch agent (fsdpkit.runtime.telemetry), nothing listens for them in the pod.

RDZV_PORT = 29500
"""The default rendezvous port: the rendezvous store pod serves it (kit and c10d backends), and under the
static and c10d backends rank 0's workers' store is MASTER_PORT = this port."""
FIXED_PORTS = STORE_PORTS
"""How many ports from the rendezvous port up the kit may listen on: RDZV_PORT .. RDZV_PORT + 2 (the NVRx
backend's stores on MASTER_PORT + 1 and + 2)."""
EPHEMERAL_PORTS = (32768, 60999)
"""Linux's default `net.ipv4.ip_local_port_range` (first, last): where kernel-picked listening ports fall."""
LOCAL_HOST = "127.0.0.1"
"""Where every listener of a local run binds (the local runner): nothing of it is on the machine's network."""


def listening_port_ranges(rdzv_port: int = RDZV_PORT) -> list[tuple[int, int]]:
    """(first, last) TCP port ranges a run's pods listen on: the fixed run from the rendezvous port, and the
    ephemeral range (kernel-picked stores, gloo and NCCL pairs)."""
    return [(rdzv_port, rdzv_port + FIXED_PORTS - 1), EPHEMERAL_PORTS]


def _kernel_picks(host: str) -> Iterator[int]:
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        yield port


def free_port_run(
    count: int = STORE_PORTS, *, host: str = "", tries: int = 64, candidates: Iterable[int] | None = None
) -> int:
    """A port P such that P .. P+count-1 can all be bound on `host` now ("" = every interface, as a
    TCPStore server listens). Candidates come from the kernel (bind to port 0) unless given.
    Raises OSError when `tries` candidates all fail."""
    picks = iter(candidates) if candidates is not None else _kernel_picks(host)
    for _, port in zip(range(tries), picks, strict=False):
        if port + count - 1 > 65535:
            continue
        with contextlib.ExitStack() as held:
            try:
                for p in range(port, port + count):
                    held.enter_context(socket.socket()).bind((host, p))
            except OSError:
                continue
        return port
    raise OSError(f"no run of {count} free TCP ports found in {tries} tries; close other jobs and retry")
