"""bench.scale's trivial worker: under a real kit launcher it joins the group, then each step all-reduces one
number, sleeps and beats; rank 0 logs each step (an event with the world size and the attempt), so the
benchmark sees when a re-formed group trains again. Nothing else: 2 cores hold 33 of them.

Usage (the launcher's target): python -m fsdpkit.launcher ... -m bench.scale_worker RUN_DIR STEP_S
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from fsdpkit.runtime.events import EventLog
from fsdpkit.runtime.heartbeat import HeartbeatClient

GROUP_TIMEOUT_S = 120.0


def main() -> None:
    run_dir, step_s = sys.argv[1], float(sys.argv[2])
    beats = HeartbeatClient.from_env()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    events = EventLog(run_dir, role="trainer", rank=rank) if rank == 0 else None
    dist.init_process_group("gloo", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    beats.phase("train")
    step = 0
    while True:
        step += 1
        total = torch.ones(1)
        dist.all_reduce(total)
        if events is not None:
            events.emit("step", step=step, world=world, members=int(total.item()))
        time.sleep(step_s)
        beats.beat(step)


if __name__ == "__main__":
    main()
