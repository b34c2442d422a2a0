"""One token stream over several memory-mapped arrays: a shard folder's files, or a Megatron .bin's runs of
sequences, read as if they were one array. Numpy only: nothing is loaded, a read copies what it returns."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class TokenStream:
    """Spans (1-d integer arrays, usually memory-mapped) concatenated in order; `read` returns int64."""

    def __init__(self, spans: Sequence[np.ndarray]) -> None:
        self.spans = [span for span in spans if span.size]
        self.starts = np.cumsum([0] + [span.size for span in self.spans])
        self.num_tokens = int(self.starts[-1])

    def read(self, start: int, length: int) -> np.ndarray:
        """`length` tokens from position `start` (a read may cross from one span into the next)."""
        if start < 0 or start + length > self.num_tokens:
            raise IndexError(
                f"tokens [{start}, {start + length}) are outside the stream of {self.num_tokens}"
            )
        out = np.empty(length, dtype=np.int64)
        filled = 0
        while filled < length:
            pos = start + filled
            i = int(np.searchsorted(self.starts, pos, side="right")) - 1
            local = pos - int(self.starts[i])
            take = min(length - filled, self.spans[i].size - local)
            out[filled : filled + take] = self.spans[i][local : local + take]
            filled += take
        return out
