"""Training data: a deterministic synthetic stream, or memory-mapped token shards.

Both sources are a pure function of (seed, global sample index), so the only state is the position:
`samples_consumed`, the number of samples the whole job has consumed. It is part of the checkpoint
(`TokenLoader` is Stateful) and identical on every rank. Rank r takes global samples
`pos + r*batch ... pos + (r+1)*batch - 1` at each step, so a resumed run reads exactly the batches it
would have read.

The shards' format is training/trainer/shards.py's. The stream is cut into non-overlapping windows of
seq_len + 1 tokens (a window may span two shards); each epoch visits every window once, in a seeded order.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

import torch

from fsdpkit.contracts.seeds import mix
from fsdpkit.trainer.shards import TokenShards

if TYPE_CHECKING:
    from fsdpkit.trainer.config import DataConfig


@functools.lru_cache(maxsize=8)  # one per epoch, not one per sample: every sample of an epoch shares it
def _affine_permutation(n: int, seed: int) -> tuple[int, int]:
    """(a, b) with gcd(a, n) == 1, so j -> (a*j + b) % n visits every window once per epoch."""
    a = mix(seed, 1) % n or 1
    while math.gcd(a, n) != 1:
        a = (a + 1) % n or 1
    return a, mix(seed, 2) % n


class TokenLoader:
    """Per-rank batches (inputs, targets) of shape (batch_size, seq_len); Stateful (its position)."""

    def __init__(self, cfg: DataConfig, *, vocab_size: int, seed: int, rank: int, world_size: int) -> None:
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.samples_consumed = 0
        self.shards = TokenShards(cfg.path) if cfg.kind == "shards" else None
        self._windows = self.shards.num_tokens // (cfg.seq_len + 1) if self.shards is not None else 0

    def _synthetic(self, index: int) -> torch.Tensor:
        # A random motif tiled along the sample: learnable (the loss falls), yet fully determined by index.
        g = torch.Generator().manual_seed(mix(self.seed, index))
        period = int(torch.randint(4, 33, (1,), generator=g))
        motif = torch.randint(0, self.vocab_size, (period,), generator=g)
        return motif.repeat(self.cfg.seq_len // period + 2)[: self.cfg.seq_len + 1]

    def _from_shards(self, index: int) -> torch.Tensor:
        assert self.shards is not None
        epoch, j = divmod(index, self._windows)
        a, b = _affine_permutation(self._windows, mix(self.seed, epoch))
        window = (a * j + b) % self._windows
        width = self.cfg.seq_len + 1
        return torch.from_numpy(self.shards.read(window * width, width))

    def sample(self, index: int) -> torch.Tensor:
        """Tokens of global sample `index` (seq_len + 1 of them)."""
        return self._synthetic(index) if self.shards is None else self._from_shards(index)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        first = self.samples_consumed + self.rank * self.cfg.batch_size
        rows = torch.stack([self.sample(first + i) for i in range(self.cfg.batch_size)])
        self.samples_consumed += self.world_size * self.cfg.batch_size
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def state_dict(self) -> dict[str, Any]:
        return {"samples_consumed": self.samples_consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.samples_consumed = int(state["samples_consumed"])
