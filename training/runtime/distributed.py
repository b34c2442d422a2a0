"""Process-group setup: backend and device chosen from the hardware, seeds, deterministic flags.

Reads the usual torch.distributed environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)
that torchrun, the kit's launcher or the NVRx launchers set; without it, runs as a single process.

The process group is built on a store the trainer holds itself (`DistContext.store`), wrapped in a
PrefixStore per launch round (`DistContext.store_scope`) and per in-process generation. Holding the store
keeps it alive across `destroy_process_group` (in-process restart), and the prefixes keep a restarted group
away from the keys of a dead one (the stale-key trap of torch's shared rendezvous store,
pytorch/pytorch#135712). With the run's token (fsdpkit.runtime.run_token) the prefix also carries a scope
derived from it.

A TCPStore server listens on every interface whatever host name it is given (torch's TCPServer binds the
wildcard address); `serve_store` binds a loopback host's listening socket itself and hands it to torch
(`master_listen_fd`), so a local run's stores are not reachable from the machine's network.
"""

from __future__ import annotations

import os
import random
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from fsdpkit.contracts import env
from fsdpkit.contracts.ports import free_port_run
from fsdpkit.runtime import stacks
from fsdpkit.runtime import torch_internals as internals
from fsdpkit.runtime.run_token import run_key
from fsdpkit.runtime.store_server import serve_store


@dataclass
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    timeout: timedelta
    store: dist.Store | None = None
    generation: int = 0
    """In-process restart generation (0 = the group created at start)."""
    mesh: DeviceMesh | None = field(default=None, repr=False)
    """FSDP's mesh: 1-D over every rank, or 2-D (replicate, shard) for HSDP (fsdpkit.resilience.parallel)."""
    replicate: int = 1
    """Replicas of the model state (the mesh's first dimension; 1 without HSDP)."""

    @property
    def shard(self) -> int:
        """Ranks per shard group: rank = replica * shard + shard index."""
        return self.world_size // self.replicate

    @property
    def attempt(self) -> int:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    @property
    def store_scope(self) -> str:
        """Key scope of this launch round in the job store, the same on every rank of every node.

        When rank 0 hosts the store (the kit launcher; torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)
        it is new each round, so one fixed scope is right. The restart count is NOT a round id: a node that
        restarts because another node failed does not spend a restart, so the counts differ between nodes
        and ranks would wait on each other's keys forever. Only the elastic agent's shared store outlives a
        round; there the restart count is the best scope there is (reference: torch-on-cpu.md §3.2), unless
        the kit's rendezvous names its round (`--rank-restart in-place`: the workers' keys live in the
        rendezvous store, which outlives every worker and node, so no rank hosts what the others need)."""
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
            kit_round = os.environ.get(env.RDZV_ROUND)
            return f"round{kit_round}" if kit_round else f"attempt{self.attempt}"
        return "job"


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def pick_device(local_rank: int) -> tuple[torch.device, str]:
    """(device, backend): NCCL on a GPU (gloo kept for CPU collectives), gloo on CPU."""
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "cpu:gloo,cuda:nccl"
    return torch.device("cpu"), "gloo"


STORE_PROBE_MAX_S = 0.05
"""Longest pause between two probes of rank 0's store port while it is not listening yet."""


def connect_store(timeout: timedelta) -> dist.Store:
    """The job's TCPStore: rank 0 hosts it unless the elastic agent already does (shared agent store)."""
    rank = _env_int("RANK", 0)
    world = _env_int("WORLD_SIZE", 1)
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = _env_int("MASTER_PORT", 29500)
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    hosts = rank == 0 and not agent_hosts
    if not hosts and not agent_hosts:
        wait_for_listener(host, port, deadline=time.monotonic() + timeout.total_seconds())
    if hosts:
        return serve_store(host, port, world_size=world, timeout=timeout)
    return dist.TCPStore(
        host, port, world_size=world, is_master=False, timeout=timeout, wait_for_workers=False
    )


def wait_for_listener(host: str, port: int, *, deadline: float) -> bool:
    """Wait until something listens on host:port (True), or until `deadline` (False: the caller connects
    anyway and reports torch's error).

    Every rank of a new round starts at once, and a rank that reaches rank 0's store before rank 0 has
    bound it is refused; torch's client then retries after a jittered 0.3-0.5 s, which made about half of
    the kit's restarts ~0.5 s slower than the rest on 2 cores. A refused connect costs the kernel a reset,
    so probing every few ms (backing off to STORE_PROBE_MAX_S) is cheap, and the first accepted probe
    ends it; the store's server ignores a connection that closes without a request."""
    pause = 0.002
    while True:
        try:
            with socket.create_connection(
                (host, port), timeout=max(0.1, min(1.0, deadline - time.monotonic()))
            ):
                return True
        except OSError:
            if time.monotonic() + pause >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, STORE_PROBE_MAX_S)


def init_distributed(
    *,
    timeout_s: float,
    store: dist.Store | None = None,
    generation: int = 0,
    replicate: int = 1,
    join: bool = False,
) -> DistContext:
    """Create the default process group and the device mesh FSDP2 shards over: 1-D over every rank, or
    (replicate, shard) when `replicate` > 1 (HSDP; the caller checked that it divides the world size).
    `join`: connect the store only; a worker started again in place joins its peers' next group."""
    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    stacks.install()  # under the kit launcher: stacks on request, to tell a hung rank from its waiting peers
    device, backend = pick_device(local_rank)
    timeout = timedelta(seconds=timeout_s)
    if "MASTER_ADDR" not in os.environ and world == 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port_run()))
    ctx = DistContext(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        device=device,
        backend=backend,
        timeout=timeout,
        replicate=replicate,
    )
    ctx.store = store if store is not None else connect_store(timeout)
    if not join:
        new_group(ctx, generation)
    return ctx


def new_group(ctx: DistContext, generation: int) -> None:
    """(Re)create the default group on a fresh key prefix; used at start and after an in-process abort."""
    prefix = f"{run_key().scoped('kit/', 'workers')}{ctx.store_scope}/gen{generation}"
    dist.init_process_group(
        backend=ctx.backend,
        store=dist.PrefixStore(prefix, ctx.store),
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=ctx.timeout,
        device_id=ctx.device if ctx.device.type == "cuda" else None,
    )
    ctx.generation = generation
    if ctx.replicate > 1:
        ctx.mesh = init_device_mesh(
            ctx.device.type, (ctx.replicate, ctx.shard), mesh_dim_names=("replicate", "shard")
        )
    else:
        ctx.mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))


def abort_groups(ctx: DistContext) -> None:
    """Abort every process group of this process (closes its connections, so peers blocked in a
    collective with us fail at once instead of waiting for the timeout), then forget them."""
    internals.forget_mesh_groups(ctx.mesh)
    ctx.mesh = None
    if dist.is_initialized():
        try:
            internals.abort_all_groups()
        except (RuntimeError, ValueError):
            dist.destroy_process_group()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def seed_everything(seed: int, rank: int) -> None:
    """Same seed on every rank for model init; per-rank streams differ only where a rank draws its own."""
    random.seed(seed + rank)
    np.random.seed((seed + rank) % 2**32)
    torch.manual_seed(seed)


def set_deterministic(enabled: bool) -> None:
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(enabled, warn_only=True)
    torch.backends.cudnn.deterministic = enabled
    torch.backends.cudnn.benchmark = not enabled
