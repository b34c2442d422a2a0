"""A tiny real distributed worker for the launcher tests (gloo on CPU), independent of the trainer.

Each step all-reduces a tensor, sleeps STEP_S, then beats; state (step, value) is saved by rank 0 after
every CKPT_EVERY steps and loaded on start, so a restarted group resumes. Faults come from
fsdpkit.resilience.faults with the spec in KIT_TEST_FAULTS; KIT_TEST_SPIN="STEP:SECONDS:RANK" makes that
rank compute (spin on the CPU) for SECONDS in STEP without beating, a slow step that is not a hang;
KIT_TEST_TORN_ERROR_FILE=1 leaves a torn torchelastic error file before EXIT_CODE_AT_START;
KIT_TEST_LINGER_S=SECONDS: a rank whose collective broke (a peer died) leaves a process that beats on for
that long, out of reach of the group's kill (a worker of the failed attempt that dies late);
KIT_TEST_RESTART_START_S=SECONDS: a restarted rank stays that long in "start" (a slow start). Every worker
records its pid in RUN_DIR/pids/ATTEMPT-RANK and, if one of an earlier attempt still runs, writes
RUN_DIR/overlap (a new attempt must start after the old one's workers are gone). Usage:
  python tests/training/launch_worker.py RUN_DIR STEPS [STEP_S] [EXIT_CODE_AT_START]
"""

import contextlib
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

from fsdpkit.resilience.faults import FaultConfig, FaultInjector
from fsdpkit.runtime.events import EventLog
from fsdpkit.runtime.heartbeat import HeartbeatClient


def main() -> None:
    run_dir = Path(sys.argv[1])
    steps = int(sys.argv[2])
    step_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.05
    if len(sys.argv) > 4:
        if os.environ.get("KIT_TEST_TORN_ERROR_FILE"):  # a trainer stopped while writing it
            Path(os.environ["TORCHELASTIC_ERROR_FILE"]).write_text('{"message": {"message": "Runtime')
        sys.exit(int(sys.argv[4]))
    hb = HeartbeatClient.from_env()
    record_pid(run_dir)
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0) > 0:
        time.sleep(float(os.environ.get("KIT_TEST_RESTART_START_S") or 0))
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
        "resume", step=start or None, source="shared" if start else "none", duration_s=0.0, fallback_from=None
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
        try:
            dist.all_reduce(tensor)
        except RuntimeError:  # a peer died
            linger_s = float(os.environ.get("KIT_TEST_LINGER_S") or 0)
            if linger_s and os.fork() == 0:
                linger(hb, step - 1, linger_s)
            raise
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


def record_pid(run_dir: Path) -> None:
    """This worker's pid for the attempts after it; RUN_DIR/overlap names any earlier one still running."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
    folder = run_dir / "pids"
    folder.mkdir(parents=True, exist_ok=True)
    for path in folder.iterdir():
        if int(path.name.split("-")[0]) < attempt:
            with contextlib.suppress(psutil.NoSuchProcess):
                if psutil.Process(int(path.read_text())).status() != psutil.STATUS_ZOMBIE:
                    (run_dir / "overlap").write_text(f"{path.name} ran beside attempt {attempt}\n")
    (folder / f"{attempt}-{os.environ['RANK']}").write_text(str(os.getpid()))


def linger(hb: HeartbeatClient, step: int, seconds: float) -> None:
    """Beat on as the failed attempt's rank for `seconds` (a new session: the group's kill misses it)."""
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    end = time.time() + seconds
    while time.time() < end:
        hb.beat(step)
        time.sleep(0.05)
    os._exit(0)


if __name__ == "__main__":
    main()
