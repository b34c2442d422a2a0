"""The straggler measure's clock (training/resilience/compute_timer.py) and how a step uses it, on CPU: the
timer follows the device, the thread's CPU time leaves out a wait, and a figure known only after the report's
all-reduce (the CUDA events' case) still reaches the detector. The CUDA timer itself needs a GPU; choosing it
does not (its events are made on first use)."""

from __future__ import annotations

import datetime
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from fsdpkit import resilience
from fsdpkit.resilience import job as job_module
from fsdpkit.resilience.compute_timer import CudaEventTimer, ThreadTimer, compute_timer
from fsdpkit.resilience.faults import FaultConfig, FaultInjector
from fsdpkit.runtime.events import EventLog, read_events


@pytest.fixture(autouse=True)
def _sigterm_restored():
    """A Job installs the drain's SIGTERM handler for the process's life: not for this pytest worker's."""
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def _spin(until: float) -> float:
    """This thread's CPU time spent until its clock reads `until`: real work, as a rank's compute is."""
    t0 = time.thread_time()
    while time.thread_time() < until:
        pass
    return time.thread_time() - t0


def test_the_timer_follows_the_device() -> None:
    assert isinstance(compute_timer(torch.device("cpu")), ThreadTimer)
    gpu = compute_timer(torch.device("cuda", 3))
    assert isinstance(gpu, CudaEventTimer) and gpu.device == torch.device("cuda", 3)


def test_the_thread_time_leaves_out_a_wait_for_a_peer() -> None:
    """The main thread waits (as in a gloo collective) while another thread works: only the work counts."""
    worker_cpu: list[float] = []
    timer = ThreadTimer()
    timer.start()
    own = _spin(time.thread_time() + 0.02)
    peer = threading.Thread(target=lambda: worker_cpu.append(_spin(time.thread_time() + 0.2)))
    peer.start()
    peer.join()  # sleeps: no CPU time of this thread
    figure = timer.stop()
    assert figure is not None and own <= figure < own + worker_cpu[0]
    assert timer.read() == figure


def test_a_slow_fault_on_cpu_does_the_work_again(tmp_path: Path) -> None:
    events = EventLog(tmp_path, role="trainer", rank=0)
    faults = FaultInjector(FaultConfig(spec="slow:step=1:rank=0:factor=3"), rank=0, world_size=2,
                           max_steps=5, events=events, run_dir=tmp_path)  # fmt: skip
    faults.maybe_inject(1)
    assert faults.slow_factor == 3.0
    t0 = time.thread_time()
    faults.slow_down(0.01, torch.device("cpu"))
    assert time.thread_time() - t0 >= 0.02  # (3 - 1) x 0.01 s of this thread's CPU, by construction
    faults.close()
    events.close()


class _FigureAfterReport(ThreadTimer):
    """Stands in for the CUDA events (the device boundary): the figure is known only after the all-reduce."""

    def stop(self) -> float | None:
        super().stop()
        return None


@pytest.mark.parametrize("timer", [ThreadTimer, _FigureAfterReport])
def test_the_step_hands_its_figure_to_the_detector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timer: type[ThreadTimer]
) -> None:
    from fsdpkit.runtime.distributed import DistContext

    monkeypatch.setattr(job_module, "compute_timer", lambda device: timer())
    cfg = resilience.load_config(["--run.id", "t", "--run.root", str(tmp_path), "--checkpoint.mode", "off"])
    job = resilience.Job(cfg)
    job.ctx = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo",
                          timeout=datetime.timedelta(seconds=5))  # fmt: skip
    model = torch.nn.Linear(2, 1)
    state = resilience.TrainState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                  data=None, rank=0)  # fmt: skip
    session = resilience.Session(job, state)
    with job.step(session) as step:
        assert isinstance(step.timer, timer)
        model(torch.ones(1, 2)).sum().backward()
        with step.update():
            session.optimizer.step()
        step.report(1.0)
    assert step.compute_s is not None and step.compute_s > 0
    assert job.stragglers.own_slot() == [step.compute_s]  # observed once, whenever it was known
    (event,) = [e for e in read_events(cfg.run.run_dir) if e["kind"] == "step"]
    assert event["compute_s"] == step.compute_s
    job.close()
