"""Everything a resume needs, as one Stateful object the checkpointer saves with DCP (public API: TrainState).

Keys: "model" and "optim" (sharded DTensors from torch.distributed.checkpoint.state_dict, so each rank
writes only its shard), "scheduler" (LR schedule), "data" (the data loader's position: one copy when it is
the same on every rank, as the kit's global sample cursor is; "data.rank<R>" with `data_per_rank`), "step",
"rng.rank<R>" (this rank's RNG states) and "extra.<name>.rank<R>" (each user extra, per rank). DCP treats
non-DTensor values as replicated and keeps one copy, so per-rank values carry the rank in their key.
A checkpoint resumes on another world size (`resharding`: DCP splits model and optimizer anew) when the
data position is declared global (`data_global`) and there are no per-rank extras (`reshard_problem`):
the RNG keys are then left out of the load and every rank is seeded again from (run seed, step, rank)
(training/resilience/checkpoint/reshard.py).

In-process restart may resume from the live state instead of a saved copy, but only from a step boundary.
`Job.step` brackets a step: `begin_step` (the data position and RNG before its first batch), `begin_update`
(just before the optimizer step: from here persistent state changes), `end_update` (the optimizer, the
schedule and the step count applied: the step is complete on this rank) and `end_step` (after its report).
`live_step()` says where a rank's live state is clean: the last completed step, with the data position and
RNG rewound to it when a step failed before its update; None when it failed mid-update (the model,
optimizer, schedule or step may hold a half-applied step). A step whose report failed is complete: the
report carries only what ranks agree on, never state (fsdpkit.resilience.replica says why that is safe).
"""

from __future__ import annotations

import copy
import random
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from fsdpkit.resilience.checkpoint.reshard import reseed


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        # Python and numpy states as byte tensors: copied at staging time, never shared with the generator.
        "python": torch.tensor(np.frombuffer(repr(random.getstate()).encode(), dtype=np.uint8).copy()),
        "numpy": torch.tensor(
            np.frombuffer(repr(np.random.get_state(legacy=True)[1].tolist()).encode(), dtype=np.uint8).copy()
        ),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import ast

    torch.set_rng_state(state["torch"])
    random.setstate(_to_tuple(ast.literal_eval(bytes(state["python"].tolist()).decode())))
    keys = np.array(ast.literal_eval(bytes(state["numpy"].tolist()).decode()), dtype=np.uint32)
    np.random.set_state(("MT19937", keys, 624, 0, 0.0))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def rng_state() -> dict[str, Any]:
    """This process's RNG states as a checkpoint keeps them (`rng.rank<R>`)."""
    return _rng_state()


def _raw_rng() -> tuple[Any, ...]:
    """The RNG states as the generators return them (cheap: taken at the start of every step)."""
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() else None
    return torch.get_rng_state(), random.getstate(), np.random.get_state(), cuda


def _set_raw_rng(raw: tuple[Any, ...]) -> None:
    cpu, py, npy, cuda = raw
    torch.set_rng_state(cpu)
    random.setstate(py)
    np.random.set_state(npy)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda)


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)  # every device's generator too
    random.seed(seed)
    np.random.seed(seed % 2**32)


def _to_tuple(value: Any) -> Any:
    return tuple(_to_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


def _prime_adam_state(optimizer: torch.optim.Optimizer) -> None:
    """Give a fresh Adam(W) its per-parameter state (zeros, as its first step creates it) without a step.

    For an optimizer without state, torch's `get_state_dict` runs a whole optimizer step on zero gradients
    to create one (`_init_optim_state`): 0.14 s of a 0.22 s restore of the tiny model on the test machine,
    paid at every resume. Every value primed here is overwritten by the load that asked for the state dict.
    """
    if optimizer.state or type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        return
    for group in optimizer.param_groups:
        for param in group["params"]:
            if not param.requires_grad:
                continue
            on_device = group["capturable"] or group["fused"]
            step = torch.zeros((), dtype=torch.float32, device=param.device if on_device else "cpu")
            state = {
                "step": step,
                "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
            }
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            optimizer.state[param] = state


class TrainState(Stateful):
    """Model, optimizer, LR scheduler, data position, step, RNG and user extras of one rank.

    `data` and each extra are Stateful (`state_dict()` / `load_state_dict()`); `data` may be None (a loader
    that needs no state) and so may `scheduler`. A step that fails before its update rewinds `data` and the
    RNG, so extras must change only inside `step.update()` or after it (an EMA, a loss scaler), never while
    the batch is computed. The loop changes `step` only through `Job.step`."""

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        data: Stateful | None = None,
        rank: int,
        data_per_rank: bool = False,
        data_global: bool = False,
        extras: dict[str, Stateful] | None = None,
    ) -> None:
        """`data_per_rank`: the loader's state differs between ranks (saved under the rank's key).
        `data_global`: the loader's position counts global samples, so it means the same on any world size
        (the kit's sample cursor): only then may a checkpoint resume on another world size. A position that
        is the same on every rank but counts per-rank batches (a DistributedSampler's) is not global."""
        if data_per_rank and data_global:
            raise ValueError("TrainState: data_per_rank and data_global exclude each other; pass one")
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.data = data
        self.rank = rank
        self.data_key = f"data.rank{rank}" if data_per_rank else "data"
        self.data_global = data_global
        self.extras = dict(extras or {})
        self.step = 0
        self.seed = 0
        """The run's seed (`run.seed`, set by Session): a resharded resume seeds every rank from it."""
        self.resharding = False
        """Set by the resume while it loads a checkpoint of another world size: no per-rank keys."""
        self.updating = False
        """True from the optimizer step of a step until that step is finished: the live state is torn."""
        self._step_start: tuple[Any, tuple[Any, ...]] | None = None
        """Data position and RNG before the current step's first batch; None between steps."""

    def begin_step(self) -> None:
        """The top of a step, before its first batch."""
        data = copy.deepcopy(self.data.state_dict()) if self.data is not None else None
        self._step_start = (data, _raw_rng())

    def begin_update(self) -> None:
        """Just before the optimizer step: from here until `end_update` the live state is not a step's."""
        self.updating = True

    def end_update(self) -> None:
        """The optimizer, the schedule and the step count are applied: the live state is step `self.step`,
        and its data position and RNG are the ones the next step starts from."""
        self.updating = False
        self._step_start = None

    def end_step(self) -> None:
        """The step is finished (optimizer, schedule, step count and its agreement collective)."""
        self.updating = False
        self._step_start = None

    def live_step(self) -> int | None:
        """The step this rank's live state is cleanly at, or None if a step failed mid-update.

        A step that failed before its update leaves model and optimizer at the previous step; its data
        position and RNG are rewound here, so a resume fetches exactly the batches it would have."""
        if self.updating:
            return None
        if self._step_start is not None:
            data, rng = self._step_start
            if self.data is not None:
                self.data.load_state_dict(data)
            _set_raw_rng(rng)
            self._step_start = None
        return self.step

    @property
    def rng_key(self) -> str:
        return f"rng.rank{self.rank}"

    def reshard_problem(self) -> str | None:
        """Why a checkpoint of this state cannot load into another world size (per-rank state), or None."""
        if self.data is not None and self.data_key != "data":
            return "the data position is per rank (TrainState data_per_rank=True)"
        if self.data is not None and not self.data_global:
            return "the data position is not declared global (TrainState data_global=True)"
        if self.extras:
            return f"per-rank extras {', '.join(sorted(self.extras))}"
        return None

    def state_dict(self) -> dict[str, Any]:
        _prime_adam_state(self.optimizer)
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        out: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        if self.scheduler is not None:
            out["scheduler"] = self.scheduler.state_dict()
        if self.data is not None:
            out[self.data_key] = self.data.state_dict()
        out["step"] = self.step
        if self.resharding:  # the template of a resharded load: another world size has no such keys
            return out
        out[self.rng_key] = _rng_state()
        for name, extra in self.extras.items():
            out[self._extra_key(name)] = extra.state_dict()
        return out

    def _extra_key(self, name: str) -> str:
        return f"extra.{name}.rank{self.rank}"

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
        )
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state_dict["scheduler"])
        if self.data is not None:
            self.data.load_state_dict(state_dict[self.data_key])
        self.step = int(state_dict["step"])
        if self.resharding:
            _seed_all(reseed(self.seed, self.step, self.rank))
            return
        _set_rng_state(state_dict[self.rng_key])
        for name, extra in self.extras.items():
            extra.load_state_dict(state_dict[self._extra_key(name)])
