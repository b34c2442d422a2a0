"""`TokenDataset` (public: `resilience.TokenDataset`): a script's token data with the kit's guarantees.

Sources: a folder of the kit's shards (`format`, KITTOK01: kit-prepare-data, kit-make-shards) or a
Megatron-LM dataset prefix (`megatron`: PREFIX.bin + PREFIX.idx). Either is one token stream cut into
non-overlapping windows of seq_len + 1 tokens (a window may span two shards or documents). A sample is a
window; epoch e visits every window once, sample j of the epoch being window (a*j + b) mod n, with a
coprime to n and b drawn from mix(seed, e): nothing of the order is held in memory, the stream stays
memory-mapped, and a sample is a pure function of (seed, its global index).

The position is one number, `samples_consumed`: the global samples the whole job has consumed, the same on
every rank, so `TrainState(data_global=True)` holds and a checkpoint resumes on another world size. A
BatchPlan splits each optimizer step's global batch: micro-batch m of rank r takes the global samples
first + m*W*B + r*B ... + B - 1 (W ranks, micro-batches of B samples, first: the step's first sample).
Numpy at import; torch when a batch is made (so a config check needs no torch).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsdpkit.contracts.seeds import mix
from fsdpkit.resilience.dataset import megatron
from fsdpkit.resilience.dataset.format import MAGIC, TokenShards, check_shards, fingerprint_json
from fsdpkit.resilience.dataset.megatron import MegatronTokens, check_ids, check_megatron
from fsdpkit.resilience.dataset.stream import TokenStream

if TYPE_CHECKING:
    import torch

    from fsdpkit.resilience.batch import BatchPlan


@functools.lru_cache(maxsize=8)  # one per epoch, not one per sample: every sample of an epoch shares it
def _affine_permutation(n: int, seed: int) -> tuple[int, int]:
    """(a, b) with gcd(a, n) == 1, so j -> (a*j + b) % n visits every window once per epoch."""
    a = mix(seed, 1) % n or 1
    while math.gcd(a, n) != 1:
        a = (a + 1) % n or 1
    return a, mix(seed, 2) % n


def _locate(path: str | Path, option: str) -> tuple[str, Path]:
    """("shards", folder) or ("megatron", prefix); ValueError (one line) for anything else."""
    path = Path(path)
    if path.is_dir():
        return "shards", path
    prefix = path.with_suffix("") if path.suffix in (".bin", ".idx") else path
    bin_path, idx_path = megatron.files(prefix)
    if bin_path.is_file() and not idx_path.is_file():
        with open(bin_path, "rb") as fh:
            if fh.read(len(MAGIC)) == MAGIC:
                raise ValueError(
                    f"{option}={str(path)!r} is one token shard: pass the folder that holds the shards"
                )
    if bin_path.is_file() or idx_path.is_file():
        return "megatron", prefix
    raise ValueError(
        f"{option}={str(path)!r} is not a folder of token shards nor a Megatron-LM prefix (PREFIX.bin + "
        f"PREFIX.idx): pass the --out folder of kit-prepare-data or kit-make-shards, or a Megatron prefix"
    )


class TokenDataset:
    """This rank's micro-batches (inputs, targets: int64 tensors of shape (B, seq_len), targets shifted by
    one token) of each global batch, in the kit's seeded order; Stateful: the global sample cursor."""

    def __init__(
        self,
        path: str | Path,
        *,
        seq_len: int,
        plan: BatchPlan,
        rank: int,
        seed: int,
        vocab_size: int | None = None,
        option: str = "path",
    ) -> None:
        """`path`: a shard folder or a Megatron prefix; `plan`: `plan_batch`'s result for this job (its
        micro-batch, world size and accumulation); `seed`: the run's (`run.seed`), which orders the samples;
        `vocab_size`: the model's, when given every sample read is checked against it; `option`: how the
        path is named in errors (`--data-dir`, `data.path`). ValueError (one line) for unusable data."""
        if seq_len < 1:
            raise ValueError(f"seq_len={seq_len} must be >= 1")
        if not 0 <= rank < plan.world_size:
            raise ValueError(f"rank {rank} is outside the plan's world of {plan.world_size} rank(s)")
        self.check(path, seq_len=seq_len, vocab_size=vocab_size, option=option)
        kind, where = _locate(path, option)
        self.stream: TokenStream = TokenShards(where) if kind == "shards" else MegatronTokens(where)
        self.path = str(path)
        self.seq_len, self.seed, self.rank, self.vocab_size = seq_len, seed, rank, vocab_size
        self.micro_batch, self.world_size, self.accum = plan.micro_batch, plan.world_size, plan.accum
        self.global_batch = plan.global_batch
        self.samples_per_epoch = self.stream.num_tokens // (seq_len + 1)
        """Windows of seq_len + 1 tokens in the stream: one epoch."""
        self.samples_consumed = 0
        """The global cursor: samples the whole job consumed (all ranks), the same on every rank."""
        self.step_samples: list[int] = []
        """The global ids of the samples this rank read in the current (or last) optimizer step, in the
        order read: the audit of exactly-once (all ranks' together are the step's global batch)."""

    @classmethod
    def check(
        cls,
        path: str | Path,
        *,
        seq_len: int,
        vocab_size: int | None = None,
        tokenizer_json: str | None = None,
        option: str = "path",
    ) -> None:
        """Whether `path` can feed a model of `vocab_size` with samples of `seq_len`: ValueError with a
        one-line fix otherwise; no torch, no process group (a config check). `tokenizer_json`: the model's
        tokenizer (`tokenizers.Tokenizer.to_str()`), compared with the fingerprint the kit's shards record
        (Megatron's files record none)."""
        kind, where = _locate(path, option)
        if kind == "shards":
            tokenizer_id = None if tokenizer_json is None else fingerprint_json(tokenizer_json)
            check_shards(
                where, seq_len=seq_len, vocab_size=vocab_size, tokenizer_id=tokenizer_id, option=option
            )
        else:
            check_megatron(where, seq_len=seq_len, vocab_size=vocab_size)

    def window(self, index: int) -> int:
        """The window global sample `index` reads (its epoch's seeded affine order)."""
        epoch, j = divmod(index, self.samples_per_epoch)
        a, b = _affine_permutation(self.samples_per_epoch, mix(self.seed, epoch))
        return (a * j + b) % self.samples_per_epoch

    def sample(self, index: int) -> torch.Tensor:
        """The seq_len + 1 tokens (int64) of global sample `index`."""
        import torch

        width = self.seq_len + 1
        tokens = self.stream.read(self.window(index) * width, width)
        if self.vocab_size is not None:
            check_ids(tokens, vocab_size=self.vocab_size, where=f"sample {index} of {self.path!r}")
        return torch.from_numpy(tokens)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's next micro-batch; the cursor moves by the whole world's micro-batch (W x B)."""
        import torch

        if self.samples_consumed % self.global_batch == 0:  # the first micro-batch of a step
            self.step_samples = []
        first = self.samples_consumed + self.rank * self.micro_batch
        ids = range(first, first + self.micro_batch)
        rows = torch.stack([self.sample(i) for i in ids])
        self.step_samples.extend(ids)
        self.samples_consumed += self.world_size * self.micro_batch
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def step_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's `plan.accum` micro-batches of the next global batch (one optimizer step)."""
        if self.samples_consumed % self.global_batch:
            raise RuntimeError(
                f"step_batches() at global sample {self.samples_consumed}, inside a global batch of "
                f"{self.global_batch}: take a step's micro-batches either all with step_batches() or all "
                f"with next_batch()"
            )
        for _ in range(self.accum):
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        return {"samples_consumed": self.samples_consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.samples_consumed = int(state["samples_consumed"])
        self.step_samples = []
