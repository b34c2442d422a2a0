"""Megatron-LM's indexed datasets read directly: a PREFIX.bin of tokens and its PREFIX.idx, as Megatron's
`IndexedDatasetBuilder` (megatron/core/datasets/indexed_dataset.py; `MMapIndexedDatasetBuilder` before it)
writes them, so data tokenized for Megatron trains here without a conversion.

The .idx, little-endian:
  9 bytes   magic b"MMIDIDX\\x00\\x00"
  <Q        version, 1
  <B        dtype code of the tokens: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32,
            8 uint16 (6 and 7 hold no token ids and are refused)
  <Q        sequence count S
  <Q        document index count D (the documents + 1: the index starts with 0)
  int32[S]  sequence lengths, in tokens
  int64[S]  sequence pointers, byte offsets into the .bin
  int64[D]  document indices: document d is sequences [idx[d], idx[d+1])
  int8[S]   sequence modes, only in a multimodal dataset (accepted, not used)
The stream is the sequences' tokens in index order (the documents', concatenated), whatever gaps the
pointers leave in the .bin; runs of adjacent sequences are one memory-mapped view each.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fsdpkit.resilience.dataset.stream import TokenStream

INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_HEADER = struct.Struct("<9sQBQQ")  # 34 bytes
DTYPES = {
    1: np.dtype("u1"), 2: np.dtype("i1"), 3: np.dtype("<i2"), 4: np.dtype("<i4"), 5: np.dtype("<i8"),
    6: np.dtype("<f8"), 7: np.dtype("<f4"), 8: np.dtype("<u2"),
}  # fmt: skip
SCAN_TOKENS = 1 << 20
"""Tokens whose ids the check reads against the vocab (the file has no vocab size); every sample read is
checked again when it is read."""


@dataclass(frozen=True)
class MegatronIndex:
    prefix: Path
    dtype: np.dtype
    sizes: np.ndarray
    """Tokens per sequence (int32)."""
    pointers: np.ndarray
    """Byte offset of each sequence in the .bin (int64)."""
    documents: np.ndarray
    """Document d is sequences [documents[d], documents[d + 1]) (int64)."""

    @property
    def num_tokens(self) -> int:
        return int(self.sizes.sum(dtype=np.int64))


def files(prefix: str | Path) -> tuple[Path, Path]:
    """(PREFIX.bin, PREFIX.idx)."""
    prefix = Path(prefix)
    return prefix.with_name(prefix.name + ".bin"), prefix.with_name(prefix.name + ".idx")


def read_index(prefix: str | Path) -> MegatronIndex:
    """PREFIX.idx read and checked against itself and PREFIX.bin; ValueError (one line) otherwise."""
    bin_path, idx_path = files(prefix)
    for path, other in ((idx_path, bin_path), (bin_path, idx_path)):
        if not path.is_file():
            raise ValueError(
                f"Megatron-LM dataset {str(prefix)!r}: {path.name} is missing beside {other.name}: pass the "
                f"prefix that both PREFIX.bin and PREFIX.idx share"
            )
    with open(idx_path, "rb") as fh:
        head = fh.read(INDEX_HEADER.size)
    if len(head) < INDEX_HEADER.size or head[:9] != INDEX_MAGIC:
        raise ValueError(
            f"{str(idx_path)!r} is not a Megatron-LM index (magic {head[:9]!r}, expected {INDEX_MAGIC!r}): "
            f"pass the .idx that Megatron's preprocess_data.py wrote"
        )
    _, version, code, count, doc_count = INDEX_HEADER.unpack(head)
    if version != 1:
        raise ValueError(f"{str(idx_path)!r} has index version {version}; this reader knows version 1")
    dtype = DTYPES.get(code)
    if dtype is None or dtype.kind == "f":
        what = f"{dtype.name} values, not token ids" if dtype is not None else "an unknown dtype"
        raise ValueError(f"{str(idx_path)!r} has dtype code {code} ({what}): tokenize it with integer ids")
    body = INDEX_HEADER.size + count * 12 + doc_count * 8
    size = idx_path.stat().st_size
    if size not in (body, body + count):  # + one int8 mode per sequence in a multimodal dataset
        raise ValueError(
            f"{str(idx_path)!r} has {size} bytes, its header ({count} sequences, {doc_count} document "
            f"indices) says {body}: it is truncated or damaged; write it again"
        )
    raw = np.memmap(idx_path, dtype=np.uint8, mode="r")  # an index of 10^8 sequences is not read whole
    offset = INDEX_HEADER.size
    sizes = np.frombuffer(raw, dtype="<i4", count=count, offset=offset)
    pointers = np.frombuffer(raw, dtype="<i8", count=count, offset=offset + count * 4)
    documents = np.frombuffer(raw, dtype="<i8", count=doc_count, offset=offset + count * 12)
    index = MegatronIndex(Path(prefix), dtype, sizes, pointers, documents)
    _check_consistent(index, idx_path, bin_path)
    return index


def _check_consistent(index: MegatronIndex, idx_path: Path, bin_path: Path) -> None:
    """Lengths, pointers and document indices that describe the .bin; ValueError (one line) otherwise."""
    docs, count, item = index.documents, index.sizes.size, index.dtype.itemsize
    if docs.size == 0 or docs[0] != 0 or docs[-1] != count or np.any(np.diff(docs) < 0):
        raise ValueError(
            f"{str(idx_path)!r}: its document indices do not run from 0 to its {count} sequences in order: "
            f"it is damaged; write it again"
        )
    ends = index.pointers + index.sizes.astype(np.int64) * item
    size = bin_path.stat().st_size
    if count and (
        np.any(index.sizes < 0) or np.any(index.pointers < 0) or np.any(index.pointers % item)
        or int(ends.max()) > size
    ):  # fmt: skip
        raise ValueError(
            f"{str(bin_path)!r} has {size} bytes, its index points past it or between tokens: the .bin "
            f"and .idx do not belong together, or one is truncated; write both again"
        )


def spans(index: MegatronIndex) -> list[np.ndarray]:
    """The .bin memory-mapped once, cut into views: one per run of adjacent sequences, in index order."""
    bin_path, _ = files(index.prefix)
    item = index.dtype.itemsize
    keep = index.sizes > 0
    starts, lengths = index.pointers[keep] // item, index.sizes[keep].astype(np.int64)
    if not starts.size:
        return []
    data = np.memmap(bin_path, dtype=index.dtype, mode="r", shape=(bin_path.stat().st_size // item,))
    ends = starts + lengths
    cuts = np.flatnonzero(starts[1:] != ends[:-1]) + 1  # a sequence that does not start where the last ended
    firsts, lasts = np.concatenate([[0], cuts]), np.concatenate([cuts, [starts.size]]) - 1
    return [data[int(starts[a]) : int(ends[b])] for a, b in zip(firsts, lasts, strict=True)]


class MegatronTokens(TokenStream):
    """PREFIX.bin's sequences in index order, memory-mapped, read as one token stream."""

    def __init__(self, prefix: str | Path) -> None:
        self.index = read_index(prefix)
        super().__init__(spans(self.index))


def check_megatron(prefix: str | Path, *, seq_len: int, vocab_size: int | None = None) -> None:
    """A Megatron-LM dataset against a run's settings; ValueError with a one-line fix otherwise. The files
    hold no vocab size: the first SCAN_TOKENS tokens are read and compared with `vocab_size`."""
    stream = MegatronTokens(prefix)
    if stream.num_tokens < seq_len + 1:
        raise ValueError(
            f"Megatron-LM dataset {str(prefix)!r} holds {stream.num_tokens} tokens, fewer than one sample "
            f"(seq_len + 1 = {seq_len + 1}): add text or lower the sequence length"
        )
    if vocab_size is not None:
        head = stream.read(0, min(stream.num_tokens, SCAN_TOKENS))
        check_ids(head, vocab_size=vocab_size, where=f"Megatron-LM dataset {str(prefix)!r}")


def check_ids(tokens: np.ndarray, *, vocab_size: int, where: str) -> None:
    """Every id in [0, vocab_size); ValueError naming the first one outside it otherwise."""
    bad = np.flatnonzero((tokens < 0) | (tokens >= vocab_size))
    if bad.size:
        raise ValueError(
            f"{where} holds token id {int(tokens[bad[0]])}, outside the model's vocab of {vocab_size}: "
            f"tokenize with the model's tokenizer or pick a model with a larger vocab"
        )
