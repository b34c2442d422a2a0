"""One tensor at a time, from the rank files to the output file: never the whole state in memory.

A tensor whose chunks are blocks of whole rows (FSDP2's Shard(0): every chunk spans all the other
dimensions) is, in row-major order, its chunks one after the other: each chunk's bytes are read piece by
piece (fsdpkit.export.dcp_read.PIECE_BYTES), converted to the output dtype and written, so memory stays
at a few pieces whatever the tensor's size. A tensor cut along another dimension (tensor parallelism) is
assembled whole first: memory is then one tensor, never the state. Values are checked as they pass: NaN or
inf in the checkpoint (a run that diverged) and values beyond float16's range are refused, in one line.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import torch

from fsdpkit.export.dcp_read import Chunk, ChunkReader, StoredTensor
from fsdpkit.export.errors import ExportError


def row_blocks(tensor: StoredTensor) -> list[Chunk] | None:
    """The chunks in row order when they are blocks of whole rows that tile the tensor exactly, else None."""
    if not tensor.shape:
        return None
    rest = tensor.shape[1:]
    chunks = [c for c in tensor.chunks if c.numel]
    if any(c.sizes[1:] != rest or any(c.offsets[1:]) for c in chunks):
        return None
    chunks.sort(key=lambda c: c.offsets[0])
    row = 0
    for c in chunks:
        if c.offsets[0] != row:
            return None
        row += c.sizes[0]
    return chunks if row == tensor.shape[0] else None


def _assembled(reader: ChunkReader, tensor: StoredTensor, piece_elems: int) -> Iterator[torch.Tensor]:
    """The tensor built whole from its chunks (any layout), then handed out in 1-D pieces."""
    full = torch.empty(tensor.shape, dtype=tensor.dtype)
    covered = 0
    for chunk in tensor.chunks:
        if not chunk.numel:
            continue
        region = full[tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes, strict=True))]
        part = reader.load(chunk)
        if tuple(part.shape) != chunk.sizes or part.dtype != tensor.dtype:
            raise ExportError(
                f"{chunk.file} at byte {chunk.start}: {tensor.name}'s chunk is {part.dtype} "
                f"{list(part.shape)}, .metadata says {tensor.dtype} {list(chunk.sizes)}"
            )
        region.copy_(part)
        covered += chunk.numel
    if covered != tensor.numel:
        raise ExportError(
            f"{tensor.name}: its chunks hold {covered} of its {tensor.numel} values: a damaged checkpoint"
        )
    flat = full.reshape(-1)
    for i in range(0, flat.numel(), piece_elems):
        yield flat[i : i + piece_elems]


def pieces(reader: ChunkReader, tensor: StoredTensor, piece_bytes: int) -> Iterator[torch.Tensor]:
    """The tensor's values in row-major order, as 1-D pieces of its stored dtype."""
    if not tensor.numel:
        return
    blocks = row_blocks(tensor)
    if blocks is None:
        yield from _assembled(reader, tensor, max(1, piece_bytes // tensor.dtype.itemsize))
        return
    for chunk in blocks:
        yield from reader.pieces(tensor.name, chunk, tensor.dtype)


def write_all(fd: int, data: memoryview) -> None:
    """Every byte of `data` to `fd` (a write may take fewer)."""
    done = 0
    while done < len(data):
        done += os.write(fd, data[done:])


_NUMPY_FLOATS = (torch.float64, torch.float32, torch.float16)
_BF16_EXPONENT = 0x7F80
"""bfloat16's exponent bits: all set for inf and NaN."""


class Scratch:
    """Buffers reused from piece to piece (converted values, the finite check's flags), so memory stays at
    a few pieces whatever the allocator does with what each piece would have freed."""

    def __init__(self) -> None:
        self._buffers: dict[torch.dtype, torch.Tensor] = {}

    def take(self, dtype: torch.dtype, n: int) -> torch.Tensor:
        """A 1-D tensor of `n` elements of `dtype`, overwritten by the next `take` of that dtype."""
        buf = self._buffers.get(dtype)
        if buf is None or buf.numel() < n:
            buf = self._buffers[dtype] = torch.empty(n, dtype=dtype)
        return buf[:n]


def all_finite(t: torch.Tensor, scratch: Scratch) -> bool:
    """No NaN or inf in the 1-D tensor `t`: numpy's vectorised check where it knows the dtype (torch's
    isfinite was ~100x slower on a busy 2-core machine), bfloat16 by its exponent bits."""
    flags = scratch.take(torch.bool, t.numel()).numpy()
    if t.dtype in _NUMPY_FLOATS:
        np.isfinite(t.numpy(), out=flags)
        return bool(flags.all())
    if t.dtype == torch.bfloat16:
        bits = scratch.take(torch.int16, t.numel()).numpy()
        np.bitwise_and(t.view(torch.int16).numpy(), _BF16_EXPONENT, out=bits)
        np.equal(bits, _BF16_EXPONENT, out=flags)
        return not bool(flags.any())
    return bool(torch.isfinite(t).all())


def _not_finite(name: str, source: torch.Tensor, dtype: torch.dtype, step: int, scratch: Scratch) -> str:
    if not all_finite(source, scratch):
        return (
            f"the checkpoint's {name} holds NaN or inf values: the run had diverged by step {step}; "
            "export an earlier --step"
        )
    top = torch.finfo(dtype).max
    return f"{name} has values beyond {dtype}'s range (+-{top:g}): export it as bfloat16 or float32"


def copy_tensor(
    fd: int,
    reader: ChunkReader,
    tensor: StoredTensor,
    dtype: torch.dtype,
    *,
    step: int,
    piece_bytes: int,
    scratch: Scratch,
) -> int:
    """Write `tensor` to `fd` as `dtype` (the planner keeps non-floating tensors' own), at the file's
    position; returns the bytes written."""
    written = 0
    check = dtype.is_floating_point
    for piece in pieces(reader, tensor, piece_bytes):
        out = piece
        if piece.dtype != dtype:
            out = scratch.take(dtype, piece.numel())
            out.copy_(piece)
        if check and not all_finite(out, scratch):
            raise ExportError(_not_finite(tensor.name, piece, dtype, step, scratch))
        data = memoryview(out.view(torch.uint8).numpy())
        write_all(fd, data)
        written += len(data)
    return written
