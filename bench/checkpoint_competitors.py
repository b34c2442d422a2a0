"""The ways to save a checkpoint that the checkpoint benchmarks compare, behind one protocol.

Both `bench.checkpoint` (CPU, 2 ranks) and `bench.gpu.checkpoint_gpu` (one GPU) drive every competitor
through `train_and_save`, so a way to save is written once, here. Each competitor imports torch (and the
kit, NVRx) when it is built: the benchmarks' parent processes read `COMPETITORS` without loading torch.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.checkpoint_measure import Measured

if TYPE_CHECKING:
    from torch.distributed.checkpoint.staging import StagingOptions

    from fsdpkit.resilience.checkpoint.config import CheckpointConfig


def train_state(model: Any, opt: Any) -> dict[str, Any]:
    """Model and optimizer state dicts, what every DCP competitor saves."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def model_state(model: Any, opt: Any) -> Any:
    """The model and optimizer as one Stateful (what a trainer's TrainState would hand over)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.stateful import Stateful

    class _State(Stateful):
        def state_dict(self) -> dict[str, Any]:
            msd, osd = get_state_dict(model, opt)
            return {"model": msd, "optim": osd}

        def load_state_dict(self, sd: dict[str, Any]) -> None:
            set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])

    return _State()


def local_flat(obj: Any, path: str = "") -> dict[str, Any]:
    """Model and optimizer state as one flat dict of local tensors (what torch.save per rank holds)."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(local_flat(v, f"{path}/{k}"))
        return out
    return {path: obj.to_local() if hasattr(obj, "to_local") else obj}


@dataclass(frozen=True, kw_only=True)
class SaveSetup:
    """What every competitor saves, through which group, and each benchmark's own settings."""

    model: Any
    opt: Any
    ckpt_pg: Any
    """The gloo group the saves' collectives run in, apart from training's."""
    rank: int
    world_size: int
    kit: CheckpointConfig
    """The kit competitor's config (mode async, backend kit, the calibrated interval)."""
    kit_app_key: str
    """Key of the model-and-optimizer Stateful in the app state the kit saves."""
    staging: StagingOptions
    """dcp_staging's DefaultStager options (pinned and on the GPU where a GPU trains)."""
    keep_sync_saves: bool = True
    """False: each sync save's folder is removed once written, for a disk that holds only two checkpoints."""

    def state(self) -> dict[str, Any]:
        return train_state(self.model, self.opt)


class Competitor:
    """One way to save, as `train_and_save` drives it: `save` every interval, `in_flight` before each step,
    `drain` after the last, then `finish`. The defaults are those of a competitor that never writes in the
    background."""

    saves = True
    """False: the loop never calls `save` (the baseline)."""

    def __init__(self, setup: SaveSetup, folder: Path) -> None:
        self.setup = setup
        self.folder = folder

    def in_flight(self) -> bool:
        """A background write of this rank is running (the next step overlaps it)."""
        return False

    def staging_pending(self) -> bool:
        """The last save's copy must end before the next optimizer step changes the tensors."""
        return False

    def wait_for_staging(self) -> None:
        """Block until the pending copy is done."""

    def save(self, step: int, path: Path) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not save; set saves = False or define save")

    def drain(self) -> None:
        """Block until every write this competitor started is durable."""

    def finish(self, m: Measured) -> None:
        """Record the figures only the competitor knows and free what it holds."""


class NoSave(Competitor):
    """`none`: trains without saving, the baseline every other competitor is compared with."""

    saves = False


class SyncSave(Competitor):
    """`sync`: torch `dcp.save` with the stock FileSystemWriter, the loop blocked for the whole write."""

    def __init__(self, setup: SaveSetup, folder: Path) -> None:
        import torch.distributed.checkpoint as dcp

        super().__init__(setup, folder)
        self._save = dcp.save

    def save(self, step: int, path: Path) -> None:
        self._save(self.setup.state(), checkpoint_id=path, process_group=self.setup.ckpt_pg)
        if not self.setup.keep_sync_saves:
            shutil.rmtree(path)


class _OneFuture(Competitor):
    """A competitor whose save returns a future; each save first waits for the previous one, so at most
    one write is in flight."""

    def __init__(self, setup: SaveSetup, folder: Path) -> None:
        import torch.distributed.checkpoint as dcp

        super().__init__(setup, folder)
        self._async_save = dcp.async_save
        self._fut: Any = None

    def in_flight(self) -> bool:
        return self._fut is not None and not self._fut.done()

    def wait_previous(self) -> None:
        if self._fut is not None:
            self._fut.result()
            self._fut = None

    def drain(self) -> None:
        self.wait_previous()


class DcpThreadSave(_OneFuture):
    """`dcp_thread`: torch `dcp.async_save`, thread mode, default stager (a blocking copy per save)."""

    def save(self, step: int, path: Path) -> None:
        self.wait_previous()
        self._fut = self._async_save(self.setup.state(), checkpoint_id=path, process_group=self.setup.ckpt_pg)


class DcpStagingSave(_OneFuture):
    """`dcp_staging`: torch `dcp.async_save` with one reused DefaultStager staging in the background; the
    copy must end before the next optimizer step."""

    def __init__(self, setup: SaveSetup, folder: Path) -> None:
        from torch.distributed.checkpoint.staging import DefaultStager

        super().__init__(setup, folder)
        self._stager = DefaultStager(setup.staging)
        self._staging: Any = None

    def staging_pending(self) -> bool:
        return self._staging is not None

    def wait_for_staging(self) -> None:
        self._staging.result()
        self._staging = None

    def save(self, step: int, path: Path) -> None:
        self.wait_previous()
        resp = self._async_save(
            self.setup.state(),
            checkpoint_id=path,
            process_group=self.setup.ckpt_pg,
            async_stager=self._stager,
        )
        self._fut, self._staging = resp.upload_completion, resp.staging_completion

    def finish(self, m: Measured) -> None:
        self._stager.close()


class KitSave(Competitor):
    """`kit`: the kit's Checkpointer with the benchmark's config; its stalls are its own events
    (maybe_save plus any optimizer-hook wait for the copy)."""

    def __init__(self, setup: SaveSetup, folder: Path) -> None:
        from fsdpkit.resilience.checkpoint.checkpointer import Checkpointer
        from fsdpkit.runtime.events import EventLog

        super().__init__(setup, folder)
        events = EventLog(folder, role="trainer", rank=setup.rank)
        self._ckpt = Checkpointer(
            setup.kit, run_dir=folder, rank=setup.rank, world_size=setup.world_size, events=events
        )

    def in_flight(self) -> bool:
        save = self._ckpt._inflight
        return save is not None and not save.done.is_set()

    def save(self, step: int, path: Path) -> None:
        self._ckpt.maybe_save(step, {self.setup.kit_app_key: model_state(self.setup.model, self.setup.opt)})

    def drain(self) -> None:
        self._ckpt.wait()

    def finish(self, m: Measured) -> None:
        from fsdpkit.runtime.events import read_events

        m.staging_bytes = self._ckpt._stager.nbytes if self._ckpt._stager else 0
        self._ckpt.close()
        mine = [e for e in read_events(self.folder) if e["kind"] == "ckpt" and e["phase"] == "stall"]
        per_step: dict[int, float] = {}
        for e in mine:
            if e["rank"] == self.setup.rank:
                per_step[e["step"]] = per_step.get(e["step"], 0.0) + e["duration_s"]
        m.stalls_s = [per_step[s] for s in sorted(per_step)]


class NvrxSave(Competitor):
    """`nvrx`: NVRx TorchAsyncCheckpoint (torch.save of each rank's local tensors), where it can run (CUDA);
    each save first finalizes the previous one."""

    def __init__(self, setup: SaveSetup, folder: Path) -> None:
        from nvidia_resiliency_ext.checkpointing.async_ckpt.torch_ckpt import TorchAsyncCheckpoint

        super().__init__(setup, folder)
        self._nvrx = TorchAsyncCheckpoint(persistent_queue=True)
        folder.mkdir(parents=True)

    def save(self, step: int, path: Path) -> None:
        self.drain()
        self._nvrx.async_save(local_flat(self.setup.state()), str(path) + ".pt")

    def drain(self) -> None:
        self._nvrx.finalize_async_save(blocking=True, no_dist=True)

    def finish(self, m: Measured) -> None:
        self._nvrx.close()


REGISTRY: dict[str, type[Competitor]] = {
    "none": NoSave,  # first: every figure is relative to it
    "sync": SyncSave,  # the cost ratio's denominator
    "dcp_thread": DcpThreadSave,
    "dcp_staging": DcpStagingSave,
    "kit": KitSave,
    "nvrx": NvrxSave,  # last: the CPU benchmark cannot run it and reports why
}
COMPETITORS = tuple(REGISTRY)


def start(name: str, setup: SaveSetup, folder: Path) -> Competitor:
    """Builds the competitor `name` (one of COMPETITORS) saving into `folder`."""
    return REGISTRY[name](setup, folder)


def train_and_save(
    comp: Competitor,
    m: Measured,
    *,
    step: Callable[[int], float],
    steps: int,
    interval: int,
    step_seed: int,
    window: AbstractContextManager[Any],
) -> None:
    """The timed loop: `steps` training steps, a save every `interval` steps but not after the last (the
    drain is timed apart). Step i trains on data seeded `step_seed + i`. Every wait and save runs inside
    `window` (a `Window`, or `nullcontext()` where the loop's own save time is not read)."""
    for i in range(1, steps + 1):
        m.overlapped.append(comp.in_flight())
        if comp.staging_pending():
            t0 = time.perf_counter()
            with window:
                comp.wait_for_staging()
            m.stalls_s[-1] += time.perf_counter() - t0
        m.step_s.append(step(step_seed + i))
        if i % interval or i == steps or not comp.saves:
            continue
        t0 = time.perf_counter()
        path = comp.folder / f"step_{i:08d}"
        with window:
            comp.save(i, path)
        m.stalls_s.append(time.perf_counter() - t0)
