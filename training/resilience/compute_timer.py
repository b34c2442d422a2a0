"""A rank's own work in one step, timed where waiting for its peers cannot count: the straggler measure.

- CPU (gloo), `ThreadTimer`: the thread's CPU time from the top of the step to its report. A rank waiting for
  its peers in a gloo collective sleeps, so the wait is not counted, and the figure is known before the
  report's all-reduce.
- CUDA, `CudaEventTimer`: the host thread only launches kernels, so its CPU time says nothing about a
  throttled GPU. Nor can CUDA events around the whole step tell the slow rank: FSDP's collectives pace every
  rank's compute stream to the slowest (a stream waits for the all-gathers its peers feed, and for the last
  reduce-scatter at the end of backward), so every rank would read the straggler's time. The events bracket
  what each rank does alone instead: from the optimizer step (`Step.update`: it works on the rank's own
  shards, no collective) to the report, where a fixed compute-bound probe (PROBE_PRODUCTS bf16 products) runs
  too, so a GPU throttled in its SM clock, which an optimizer's memory-bound kernels hardly show, is seen as
  well. Nothing waits for the events: they are read after the report's all-reduce, whose result the host
  waits for anyway, so a step's figure reaches the detector one step later than on CPU.

`Step` calls, in order: `start` (top of the step), `update_starts` (the optimizer step), `end_own_work` (the
rank's own work is done; what a `slow` fault repeats), `stop` (just before the report's all-reduce: the figure
when already known, else None) and, after the all-reduce, `read`.
"""

from __future__ import annotations

import time

import torch

PROBE_N = 2048
"""Side of the probe's bf16 matrices (8 MiB each, kept for the run)."""
PROBE_PRODUCTS = 8
"""Products per step: ~0.2 ms on an H100, the probe's whole cost."""


class ThreadTimer:
    """CPU: the thread's CPU time from the top of the step (a wait in a gloo collective sleeps)."""

    def __init__(self) -> None:
        self._t0 = 0.0
        self._figure = 0.0

    def start(self) -> None:
        self._t0 = time.thread_time()

    def update_starts(self) -> None:
        """Nothing to mark: the whole step is the rank's own work on CPU."""

    def end_own_work(self) -> float:
        """This step's own work so far, seconds: what a `slow` fault does again."""
        return time.thread_time() - self._t0

    def stop(self) -> float | None:
        self._figure = time.thread_time() - self._t0
        return self._figure

    def read(self) -> float:
        return self._figure


class CudaEventTimer:
    """CUDA: events on the compute stream from the optimizer step to the report, the probe included."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._events: dict[str, torch.cuda.Event] = {}
        self._probe: tuple[torch.Tensor, torch.Tensor] | None = None
        self._begun = False
        self._last_own = 0.0

    def _record(self, name: str) -> None:
        if name not in self._events:  # made on first use: selecting this timer needs no GPU
            self._events[name] = torch.cuda.Event(enable_timing=True)
        self._events[name].record(torch.cuda.current_stream(self.device))

    def start(self) -> None:
        self._begun = False

    def update_starts(self) -> None:
        self._record("begin")
        self._begun = True

    def end_own_work(self) -> float:
        """Runs the probe and marks the end of the rank's own work; returns the previous step's own work
        (this step's is still on the GPU), seconds: what a `slow` fault does again."""
        if not self._begun:  # a report without an update: the probe alone
            self.update_starts()
        if self._probe is None:
            a = torch.ones(PROBE_N, PROBE_N, device=self.device, dtype=torch.bfloat16)
            self._probe = (a, torch.empty_like(a))
        a, out = self._probe
        for _ in range(PROBE_PRODUCTS):
            torch.mm(a, a, out=out)
        self._record("own")
        return self._last_own

    def stop(self) -> float | None:
        self._record("end")
        return None

    def read(self) -> float:
        """The step's figure, seconds; call it after the report's all-reduce (the events are then done)."""
        begin, own, end = self._events["begin"], self._events["own"], self._events["end"]
        end.synchronize()  # returns at once: the report's result reached the host after these events
        self._last_own = begin.elapsed_time(own) / 1000.0
        return begin.elapsed_time(end) / 1000.0


def compute_timer(device: torch.device) -> ThreadTimer | CudaEventTimer:
    """The timer for a rank whose work runs on `device`."""
    return CudaEventTimer(device) if device.type == "cuda" else ThreadTimer()
