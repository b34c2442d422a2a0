"""Everything a resume needs, as one Stateful object the checkpointer saves with DCP.

Keys: "model" and "optim" (sharded DTensors from torch.distributed.checkpoint.state_dict, so each rank
writes only its shard), "scheduler" (LR schedule), "data" (position in the token stream), "step", and
"rng.rank<R>" (this rank's RNG states). DCP treats non-DTensor values as replicated and keeps one copy,
so per-rank values carry the rank in their key; a checkpoint therefore resumes on the same world size.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from training.data import TokenLoader


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


def _to_tuple(value: Any) -> Any:
    return tuple(_to_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


class TrainState(Stateful):
    """Model, optimizer, LR scheduler, data position, step and RNG of one rank."""

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        data: TokenLoader,
        rank: int,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.data = data
        self.rank = rank
        self.step = 0

    @property
    def rng_key(self) -> str:
        return f"rng.rank{self.rank}"

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {
            "model": model_sd,
            "optim": optim_sd,
            "scheduler": self.scheduler.state_dict(),
            "data": self.data.state_dict(),
            "step": self.step,
            self.rng_key: _rng_state(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
        )
        self.scheduler.load_state_dict(state_dict["scheduler"])
        self.data.load_state_dict(state_dict["data"])
        self.step = int(state_dict["step"])
        _set_rng_state(state_dict[self.rng_key])
