"""One rank of tests/training/checkpoint/test_ckpt_transfer.py: write this rank's tier copy of step 2, then
exchange copies with the buddy (`replicate`), or, with --die-before RANK, that rank exits once its peers have
said (in the job's store) that they are entering the exchange, as a node lost mid-save; prints one JSON line:
what replicate returned or raised, and how long it took."""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from fsdpkit.resilience.checkpoint.blob import write_blob
from fsdpkit.resilience.checkpoint.comm import CheckpointComm
from fsdpkit.resilience.checkpoint.tier import NodeTier, new_record
from fsdpkit.resilience.checkpoint.transfer import replicate


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tier-root", required=True)
    p.add_argument("--die-before", type=int, default=-1)
    p.add_argument("--pg-timeout-s", type=float, default=60.0)
    a = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = timedelta(seconds=a.pg_timeout_s)
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0, timeout=timeout
    )
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    comm = CheckpointComm(rank=rank, world_size=world, timeout_s=a.pg_timeout_s)
    tier = NodeTier(Path(a.tier_root) / f"node{rank}")
    state = {"w": torch.full((1 << 20,), float(rank)), "step": 2}
    entry = write_blob(tier.pending(2, rank), state)
    tier.publish(2, rank)
    own = new_record(entry, step=2, rank=rank, world_size=world, origin="own")
    tier.commit(own)
    comm.barrier()
    if rank == a.die_before:  # while its peers enter the exchange, or already wait in it
        store.wait([f"exchanging/{peer}" for peer in range(world) if peer != rank])
        os._exit(0)  # every socket of this process closes, as when its node is lost
    store.set(f"exchanging/{rank}", "1")
    t0 = time.monotonic()
    try:
        got = replicate(comm, tier, own, local_world_size=1)
        out = {"held_for": None if got is None else got.rank, "origin": None if got is None else got.origin}
    except Exception as exc:  # the outcome under test: which error, and that it came
        out = {"error": f"{type(exc).__name__}: {exc}"}
    out["seconds"] = time.monotonic() - t0
    out["held"] = sorted(tier.held(2))
    out["pending"] = sorted(p.name for p in (Path(a.tier_root) / f"node{rank}").rglob("*.tmp"))
    print(json.dumps(out), flush=True)
    os._exit(0)  # no teardown collective with a dead peer


if __name__ == "__main__":
    main()
