"""Safetensors files written as a stream: every header is computed from the checkpoint's metadata before
any data is read, then each tensor's bytes follow in header order.

The format (github.com/huggingface/safetensors): 8 bytes, the header's length (little-endian u64); the
header, JSON: `{name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__":
{"format": "pt"}}`, padded with spaces to a multiple of 8; then the data, little-endian, row-major, each
tensor's bytes at its offsets, with no gap. Tensors are laid out by element size, largest first, so every
tensor starts aligned to its element (the safetensors library does the same).

Sharding follows `save_pretrained`: tensors in the model's order fill a file until the next would pass
`max_shard_bytes` (a tensor larger than that gets a file of its own); one file is `model.safetensors`,
several are `model-0000i-of-0000n.safetensors` with `model.safetensors.index.json` (total size and each
tensor's file).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fsdpkit.export.dcp_read import StoredTensor
from fsdpkit.export.errors import ExportError
from fsdpkit.export.stream import write_all

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint64: "U64", torch.uint32: "U32", torch.uint16: "U16", torch.uint8: "U8", torch.bool: "BOOL",
}  # fmt: skip
"""torch dtype -> safetensors dtype name."""


@dataclass(frozen=True)
class OutTensor:
    name: str
    """Its name in the file (the Hugging Face model's)."""
    source: StoredTensor
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return self.source.numel * self.dtype.itemsize


@dataclass(frozen=True)
class ShardFile:
    name: str
    tensors: tuple[OutTensor, ...]
    """In data order."""

    def header(self) -> bytes:
        """The 8-byte length and the padded JSON header."""
        entries: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for t in self.tensors:
            entries[t.name] = {"dtype": DTYPES[t.dtype], "shape": list(t.source.shape),
                               "data_offsets": [offset, offset + t.nbytes]}  # fmt: skip
            offset += t.nbytes
        text = json.dumps(entries, separators=(",", ":")).encode("utf-8")
        text += b" " * (-len(text) % 8)
        return struct.pack("<Q", len(text)) + text

    @property
    def data_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def size(self) -> int:
        return len(self.header()) + self.data_bytes


def out_dtype(source: torch.dtype, asked: torch.dtype) -> torch.dtype:
    """The dtype a tensor is written in: `asked` for floating tensors, its own for the others."""
    return asked if source.is_floating_point else source


def plan(tensors: Sequence[OutTensor], max_shard_bytes: int) -> list[ShardFile]:
    """The files, in the model's order; the one file is `model.safetensors`."""
    for t in tensors:
        if t.dtype not in DTYPES:
            raise ExportError(f"{t.source.name} is {t.dtype}, which safetensors cannot hold")
    groups: list[list[OutTensor]] = [[]]
    size = 0
    for t in tensors:
        if groups[-1] and size + t.nbytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(t)
        size += t.nbytes
    n = len(groups)
    names = [SINGLE_FILE] if n == 1 else [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    return [
        ShardFile(name, tuple(sorted(group, key=lambda t: -t.dtype.itemsize)))
        for name, group in zip(names, groups, strict=True)
    ]


def index(shards: Sequence[ShardFile]) -> dict[str, Any] | None:
    """model.safetensors.index.json's content for several files; None for one."""
    if len(shards) == 1:
        return None
    weight_map = {t.name: s.name for s in shards for t in s.tensors}
    total = sum(s.data_bytes for s in shards)
    return {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}


def write_shard(
    path: Path, shard: ShardFile, copy: Callable[[int, OutTensor], int], *, fsync: bool = True
) -> None:
    """Write `shard` to `path`: its header, then each tensor through `copy(fd, tensor) -> bytes written`,
    checked against the header's offsets as it goes."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, memoryview(shard.header()))
        for t in shard.tensors:
            got = copy(fd, t)
            if got != t.nbytes:
                raise ExportError(f"{t.source.name}: {got} bytes written, its header says {t.nbytes}")
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
