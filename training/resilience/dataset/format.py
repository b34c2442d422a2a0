"""The kit's token shard format, KITTOK01: the data tools write it (fsdpkit.data), `TokenDataset` reads it.

Shard format (one `*.bin` file per shard, files read in name order, tokens concatenated):
  bytes 0-7    magic b"KITTOK01"
  bytes 8-11   item size in bytes, uint32 little-endian (2 = uint16 tokens, 4 = uint32 tokens)
  bytes 12-15  vocab size, uint32 (every token id is < vocab size)
  bytes 16-23  number of tokens, uint64
  bytes 24-31  tokenizer fingerprint, uint64 (`fingerprint_json`; 0 = unknown or the kit's byte
               tokenizer, which make_shards writes; prepare_data writes the Hugging Face tokenizer's)
  bytes 32-    the tokens, little-endian

Standard library and numpy only: the config check and the data tools read shards without torch.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fsdpkit.resilience.dataset.stream import TokenStream

MAGIC = b"KITTOK01"
HEADER = struct.Struct("<8sIIQQ")  # 32 bytes
_DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}
REMAKE = "make the folder again with kit-prepare-data (a Hugging Face tokenizer) or kit-make-shards"


@dataclass(frozen=True)
class ShardHeader:
    itemsize: int
    vocab_size: int
    num_tokens: int
    tokenizer_id: int = 0
    """The tokenizer fingerprint (bytes 24-31); 0: unknown, or the kit's byte tokenizer."""


def fingerprint_json(tokenizer_json: str) -> int:
    """64-bit fingerprint of a tokenizer's JSON (`tokenizers.Tokenizer.to_str()`), never 0: the first 8
    bytes (little-endian) of sha256 over the JSON re-dumped with sorted keys, and with `truncation` and
    `padding` cleared (runtime settings: prepare_data turns both off, and they do not change the ids)."""
    doc = json.loads(tokenizer_json)
    if isinstance(doc, dict):
        doc = doc | {"truncation": None, "padding": None}
    canonical = json.dumps(doc, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return int.from_bytes(hashlib.sha256(canonical.encode()).digest()[:8], "little") or 1


def write_shard(path: str | Path, tokens: np.ndarray, *, vocab_size: int, tokenizer_id: int = 0) -> None:
    """Write one shard (uint16 when the vocab fits, else uint32), atomically via a temporary name;
    `tokenizer_id` is the tokenizer fingerprint stored in the header (0: unknown / the byte tokenizer)."""
    if not 0 <= tokenizer_id < 2**64:
        raise ValueError(f"tokenizer_id {tokenizer_id} is not a 64-bit unsigned fingerprint")
    itemsize = 2 if vocab_size <= 2**16 else 4
    arr = np.ascontiguousarray(tokens, dtype=_DTYPES[itemsize])
    if arr.size and int(arr.max()) >= vocab_size:
        raise ValueError(f"token id {int(arr.max())} is >= vocab_size {vocab_size}")
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(HEADER.pack(MAGIC, itemsize, vocab_size, arr.size, tokenizer_id))
        fh.write(arr.tobytes())
    tmp.replace(path)


def read_header(path: str | Path) -> ShardHeader:
    """The header of one shard, checked against the file's size; ValueError (one line) otherwise."""
    path = Path(path)
    with open(path, "rb") as fh:
        raw = fh.read(HEADER.size)
    if len(raw) < HEADER.size:
        raise ValueError(f"shard {str(path)!r} is shorter than its {HEADER.size}-byte header: {REMAKE}")
    magic, itemsize, vocab, n, tokenizer_id = HEADER.unpack(raw)
    if magic != MAGIC or itemsize not in _DTYPES:
        if path.with_suffix(".idx").is_file():
            raise ValueError(
                f"{str(path)!r} is a Megatron-LM .bin, not a token shard: pass its prefix "
                f"{str(path.with_suffix(''))!r} instead of the folder"
            )
        raise ValueError(
            f"{str(path)!r} is not a token shard (bad magic or item size): rebuild it with make_shards"
        )
    expected = HEADER.size + n * itemsize
    if path.stat().st_size != expected:
        raise ValueError(
            f"shard {str(path)!r} has {path.stat().st_size} bytes, its header says {expected}: "
            f"it is truncated or damaged; rebuild it with make_shards"
        )
    return ShardHeader(itemsize=itemsize, vocab_size=vocab, num_tokens=n, tokenizer_id=tokenizer_id)


def shard_files(folder: str | Path) -> list[Path]:
    return sorted(Path(folder).glob("*.bin"))


def check_shards(
    folder: str | Path,
    *,
    seq_len: int,
    vocab_size: int | None = None,
    tokenizer_id: int | None = None,
    option: str = "data.path",
) -> None:
    """Validate a shard folder against a run's settings; ValueError with a one-line fix otherwise.

    The shards of one folder must share one tokenizer fingerprint. `tokenizer_id` (the model's tokenizer,
    `fingerprint_json`; 0 for the kit's byte tokenizer) must then equal it exactly: shards of the byte
    tokenizer (0) do not fit a model with a Hugging Face tokenizer, nor the reverse. None skips that check,
    and `vocab_size` None the vocab's. `option` names the folder in messages as the user gave it.
    """
    files = shard_files(folder)
    if not files:
        raise ValueError(f"{option}={str(folder)!r} holds no *.bin shards: {REMAKE}")
    headers = [read_header(f) for f in files]
    ids: dict[int, Path] = {}  # fingerprint -> its first shard, in name order
    for f, h in zip(files, headers, strict=True):
        ids.setdefault(h.tokenizer_id, f)
    if len(ids) > 1:
        (a, fa), (b, fb) = list(ids.items())[:2]
        raise ValueError(
            f"shards in {str(folder)!r} were made with different tokenizers ({fa.name}: fingerprint "
            f"{a:016x}, {fb.name}: {b:016x}): make the folder again from one prepare_data run"
        )
    made_with = headers[0].tokenizer_id
    if tokenizer_id is not None and made_with != tokenizer_id:
        fix = (
            "run make_shards again (the model uses the kit's byte tokenizer)"
            if tokenizer_id == 0
            else "run prepare_data again with the model's tokenizer"
        )
        raise ValueError(
            f"shards in {str(folder)!r} were made with another tokenizer "
            f"(fingerprint {made_with:016x} vs {tokenizer_id:016x}): {fix}"
        )
    vocab = max(h.vocab_size for h in headers)
    if vocab_size is not None and vocab > vocab_size:
        raise ValueError(
            f"shards in {str(folder)!r} use vocab size {vocab} > the model's {vocab_size}: "
            f"pick a larger model, or tokenize with the model's tokenizer"
        )
    total = sum(h.num_tokens for h in headers)
    if total < seq_len + 1:
        raise ValueError(
            f"shards in {str(folder)!r} hold {total} tokens, fewer than one sample "
            f"(seq_len + 1 = {seq_len + 1}): add text or lower the sequence length"
        )


class TokenShards(TokenStream):
    """A shard folder's files, memory-mapped, read as one concatenated token stream."""

    def __init__(self, folder: str | Path) -> None:
        self.files = shard_files(folder)
        maps = []
        for f in self.files:
            h = read_header(f)
            if not h.num_tokens:  # an empty shard holds nothing to map (mmap refuses a length of 0)
                continue
            maps.append(
                np.memmap(f, dtype=_DTYPES[h.itemsize], mode="r", offset=HEADER.size, shape=(h.num_tokens,))
            )
        super().__init__(maps)
