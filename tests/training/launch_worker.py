"""A tiny real distributed worker for the launcher tests (gloo on CPU), independent of the trainer.

Each step all-reduces a tensor, sleeps STEP_S, then beats; state (step, value) is saved by rank 0 after
every CKPT_EVERY steps and loaded on start, so a restarted group resumes. Faults come from
training.faults with the spec in KIT_TEST_FAULTS; KIT_TEST_SPIN="STEP:SECONDS:RANK" makes that rank compute
(spin on the CPU) for SECONDS in STEP without beating, a slow step that is not a hang;
KIT_TEST_TORN_ERROR_FILE=1 leaves a torn torchelastic error file before EXIT_CODE_AT_START. Usage:
  python tests/training/launch_worker.py RUN_DIR STEPS [STEP_S] [EXIT_CODE_AT_START]
"""

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from training.events import EventLog
from training.faults import FaultConfig, FaultInjector
from training.heartbeat import HeartbeatClient


def main() -> None:
    run_dir = Path(sys.argv[1])
    steps = int(sys.argv[2])
    step_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.05
    if len(sys.argv) > 4:
        if os.environ.get("KIT_TEST_TORN_ERROR_FILE"):  # a trainer stopped while writing it
            Path(os.environ["TORCHELASTIC_ERROR_FILE"]).write_text('{"message": {"message": "Runtime')
        sys.exit(int(sys.argv[4]))
    hb = HeartbeatClient.from_env()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    events = EventLog(run_dir, role="trainer", rank=rank)
    events.emit("start", world_size=world, model="test", ckpt_mode="sync")
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    hb.phase("load")
    state_file = run_dir / "state.json"
    start, value = 0, 0.0
    if state_file.exists():
        saved = json.loads(state_file.read_text())
        start, value = saved["step"], saved["value"]
    events.emit(
        "resume", step=start or None, source="disk" if start else "none", duration_s=0.0, fallback_from=None
    )
    hb.phase("train")
    injector = FaultInjector(
        FaultConfig(spec=os.environ.get("KIT_TEST_FAULTS", "")),
        rank=rank,
        world_size=world,
        max_steps=steps,
        events=events,
        run_dir=run_dir,
    )
    spin_step, spin_s, spin_rank = (os.environ.get("KIT_TEST_SPIN") or "0:0:0").split(":")
    for step in range(start + 1, steps + 1):
        injector.maybe_inject(step)
        if step == int(spin_step) and rank == int(spin_rank):
            end = time.monotonic() + float(spin_s)
            while time.monotonic() < end:
                pass
        t0 = time.time()
        tensor = torch.tensor([float(rank + 1)])
        dist.all_reduce(tensor)
        value = value * 0.5 + float(tensor.item()) + step
        time.sleep(step_s)
        events.emit("step", step=step, loss=value, duration_s=time.time() - t0, t_start=t0)
        if step % 2 == 0:
            hb.phase("checkpoint")
            dist.barrier()
            if rank == 0:
                tmp = state_file.with_suffix(".tmp")
                tmp.write_text(json.dumps({"step": step, "value": value}))
                os.replace(tmp, state_file)
            dist.barrier()
        hb.beat(step)
    if rank == 0:
        (run_dir / "final.json").write_text(json.dumps({"step": steps, "value": value}))
    events.emit("end", step=steps)
    injector.close()
    hb.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
