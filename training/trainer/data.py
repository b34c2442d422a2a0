"""The trainer's synthetic token stream (data.kind=synthetic); token shards are the API's TokenDataset.

A pure function of (seed, global sample index), so the only state is the position: `samples_consumed`, the
number of samples the whole job has consumed. It is part of the checkpoint (`TokenLoader` is Stateful) and
identical on every rank. Rank r takes global samples `pos + r*batch ... pos + (r+1)*batch - 1` at each
micro-batch, as `resilience.TokenDataset` does, so a resumed run reads exactly the batches it would have.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from fsdpkit.contracts.seeds import mix

if TYPE_CHECKING:
    from fsdpkit.trainer.config import DataConfig


class TokenLoader:
    """Per-rank synthetic batches (inputs, targets), each (batch_size, seq_len); Stateful (its position)."""

    def __init__(self, cfg: DataConfig, *, vocab_size: int, seed: int, rank: int, world_size: int) -> None:
        if cfg.kind != "synthetic":
            raise ValueError(f"TokenLoader makes synthetic data; data.kind={cfg.kind} is TokenDataset's")
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.samples_consumed = 0

    def sample(self, index: int) -> torch.Tensor:
        """Tokens of global sample `index` (seq_len + 1 of them): a random motif tiled along the sample,
        learnable (the loss falls), yet fully determined by the index."""
        g = torch.Generator().manual_seed(mix(self.seed, index))
        period = int(torch.randint(4, 33, (1,), generator=g))
        motif = torch.randint(0, self.vocab_size, (period,), generator=g)
        return motif.repeat(self.cfg.seq_len // period + 2)[: self.cfg.seq_len + 1]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        first = self.samples_consumed + self.rank * self.cfg.batch_size
        rows = torch.stack([self.sample(first + i) for i in range(self.cfg.batch_size)])
        self.samples_consumed += self.world_size * self.cfg.batch_size
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def state_dict(self) -> dict[str, Any]:
        return {"samples_consumed": self.samples_consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.samples_consumed = int(state["samples_consumed"])
