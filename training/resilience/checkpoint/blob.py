"""One rank's state as one file in memory: what the node-local and peer tiers keep (see `tier`).

A blob is the tree a save staged (every tensor of the rank's state dict, DTensors as their local shard, the
small plain leaves as they are), laid out so that a restore is a memory copy: a header (the tree with a
placeholder per tensor: dtype, shape, offset), then each tensor's raw bytes, 64-byte aligned (page-aligned
from 64 KiB), zeros between. `write_blob` writes it through the checkpoint writer's `ChecksumFile`, so its
CRC-32C is computed over the same memory as it goes out; the tier's record keeps (size, crc32c) and a
restore verifies them exactly as resume verifies a shard.

The header is the kit's tagged JSON (`wire`), never a pickle: a blob is read from node memory that other
processes can write, and a peer's copy arrives with a checksum its sender computed, so nothing in it may be
able to run code. A leaf other than a plain value (what `wire` encodes) fails the write: the tier keeps no
copy of that step, and the shared tier serves it.

An async save stages straight into its blob (`plan_blob`, `stage_blob`, `seal_blob`): the host copy that
the shard is written from, and that an in-process restart restores, is the blob's memory (a file in the
tier, mapped shared), so the tier costs no second copy of the state, only the checksum pass that seals it.
For that, the data section starts on a page (the header is padded with spaces, which JSON ignores) and
each tensor of at least 64 KiB starts on a page, as the stager's own buffers do: the shard writer sends
them to the device with O_DIRECT as they are.

Why not a copy of the DCP shard: DCP keeps one copy of each replicated value (the step, the schedule, a
shared data position) in whichever rank's file its planner picks, so a rank's own shard file cannot restore
that rank alone. A blob holds everything one rank needs and nothing else; it restores the rank that wrote
it, on the same world size and model (`fits` checks every tensor's local shape and dtype before anything
is copied).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from fsdpkit.resilience.checkpoint.commit import CHECKSUMS, WRITTEN_CHECKSUM, FileEntry
from fsdpkit.resilience.checkpoint.guard import SaveGuard
from fsdpkit.resilience.checkpoint.wire import TensorRef, WireError, decode, encode
from fsdpkit.resilience.checkpoint.writer import ALIGN as PAGE
from fsdpkit.resilience.checkpoint.writer import ChecksumFile

FORMAT = "kit-tier-blob/2"
MAGIC = b"KITBLOB2"
"""/2: the header is tagged JSON (/1 was a pickle, and is refused like any other file that is not a blob)."""
_PREFIX = struct.Struct("<8sQ")
"""Magic, then the header's length in bytes."""
_ALIGN = 64
_PAGE_ALIGNED_FROM = 64 << 10
"""Tensors of at least this many bytes start on a page (the shard writer's O_DIRECT threshold)."""


class BlobError(ValueError):
    """A blob that cannot be read as one (truncated, another format, a bad header); one line."""


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _align(offset: int, nbytes: int) -> int:
    alignment = PAGE if nbytes >= _PAGE_ALIGNED_FROM else _ALIGN
    return -(-offset // alignment) * alignment


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes a rank holds: a DTensor's local shard, on the host, contiguous."""
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    local = local.detach()
    if local.device.type != "cpu":
        local = local.cpu()
    return local.contiguous()


def _layout(obj: Any, tensors: list[torch.Tensor], refs: list[TensorRef], offset: list[int]) -> Any:
    """The tree with each tensor replaced by its `TensorRef` (offsets relative to the data section); the
    tensors (as they are: a DTensor stays one) and their refs in tree order."""
    if isinstance(obj, torch.Tensor):
        local = obj.to_local() if isinstance(obj, DTensor) else obj
        nbytes = local.numel() * local.element_size()
        start = _align(offset[0], nbytes)
        offset[0] = start + nbytes
        ref = TensorRef(_dtype_name(local.dtype), tuple(local.shape), start, nbytes)
        tensors.append(obj)
        refs.append(ref)
        return ref
    if isinstance(obj, dict):
        return {k: _layout(v, tensors, refs, offset) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_layout(v, tensors, refs, offset) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_layout(v, tensors, refs, offset) for v in obj)
    return obj


@dataclass(frozen=True)
class BlobLayout:
    """Where everything of a blob goes: `head` (prefix and header, padded to a page: the data section
    starts right after it), each tensor's `TensorRef` (in tree order), and the blob's size."""

    head: bytes
    refs: list[TensorRef]
    size: int

    @property
    def base(self) -> int:
        return len(self.head)


def plan_blob(tree: dict[str, Any]) -> tuple[BlobLayout, list[torch.Tensor]]:
    """The layout of `tree`'s blob (tensor leaves live or staged, only their local shapes and dtypes are
    read), and its tensors in tree order. TypeError for a leaf the tier cannot keep (see `wire`)."""
    tensors: list[torch.Tensor] = []
    refs: list[TensorRef] = []
    end = [0]
    skeleton = _layout(tree, tensors, refs, end)
    header = encode({"format": FORMAT, "tree": skeleton})
    header += b" " * (-(_PREFIX.size + len(header)) % PAGE)  # the data section starts on a page
    head = _PREFIX.pack(MAGIC, len(header)) + header
    return BlobLayout(head=head, refs=refs, size=len(head) + end[0]), tensors


def stage_blob(mem: mmap.mmap, layout: BlobLayout) -> list[torch.Tensor]:
    """Lay `layout` out in `mem` (a blob file's map, `layout.size` bytes, maybe holding an older blob):
    the header and zeros between the tensors are written; returns one host tensor per tensor of the
    layout, a view into `mem`, for the stager to copy the state into."""
    mem[: layout.base] = layout.head
    views = []
    end = layout.base
    for ref in layout.refs:
        start = layout.base + ref.offset
        if start > end:
            mem[end:start] = bytes(start - end)
        end = start + ref.nbytes
        dtype = getattr(torch, ref.dtype)
        numel = ref.nbytes // dtype.itemsize
        if numel == 0:
            views.append(torch.empty(ref.shape, dtype=dtype))
        else:
            views.append(torch.frombuffer(mem, dtype=dtype, count=numel, offset=start).view(ref.shape))
    return views


def seal_blob(mem: mmap.mmap, layout: BlobLayout) -> FileEntry:
    """The size and CRC-32C of a blob staged in `mem` (one pass over it, the GIL released)."""
    view = memoryview(mem)[: layout.size]
    try:
        return FileEntry(size=layout.size, **{WRITTEN_CHECKSUM: CHECKSUMS[WRITTEN_CHECKSUM](view, 0)})
    finally:
        view.release()


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """A contiguous host tensor's bytes in place (no copy)."""
    return memoryview((ctypes.c_char * tensor.nbytes).from_address(tensor.data_ptr())).cast("B")


def write_blob(path: Path, tree: dict[str, Any], *, guard: SaveGuard | None = None) -> FileEntry:
    """Write `tree` (a staged or live state dict) to `path`; its size and CRC-32C. Raises OSError, and
    SaveAbandoned (from `guard`) between tensors once the save is abandoned."""
    layout, tensors = plan_blob(tree)  # TypeError for a leaf the tier cannot keep
    out = ChecksumFile(path, direct=False)
    try:
        out.write(layout.head)
        for tensor, ref in zip(tensors, layout.refs, strict=True):
            if guard is not None:
                guard.check()
            out.write(bytes(layout.base + ref.offset - out.tell()))
            local = _local(tensor)  # held while its bytes are written (a view of it has no reference)
            if ref.nbytes:
                out.write(_bytes_of(local))
        return out.close(fsync=False)  # memory-backed: nothing to make durable
    except BaseException:
        out.abort()
        raise


@dataclass
class Blob:
    """An open blob: `tree` holds tensors that are views into the file's memory (valid until `close`)."""

    tree: dict[str, Any]
    _map: mmap.mmap

    def close(self) -> None:
        self.tree = {}
        with contextlib.suppress(BufferError):  # a view is still referenced: the map goes with it
            self._map.close()


def open_blob(path: Path) -> Blob:
    """Map the blob at `path` (copy-on-write: restoring never writes to it); BlobError if it is not one."""
    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        if size < _PREFIX.size:
            raise BlobError(f"{_name(path)}: {size} bytes, shorter than a blob's prefix")
        mem = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    try:
        magic, header_len = _PREFIX.unpack_from(mem, 0)
        if magic != MAGIC or _PREFIX.size + header_len > size:
            raise BlobError(
                f"{_name(path)}: not a {FORMAT} file (magic {magic!r}, header {header_len} bytes)"
            )
        try:
            header = decode(mem[_PREFIX.size : _PREFIX.size + header_len], tensors=True)
        except WireError as exc:
            raise BlobError(f"{_name(path)}: header {exc}") from None
        if not isinstance(header, dict) or header.get("format") != FORMAT or "tree" not in header:
            raise BlobError(f"{_name(path)}: header is not {FORMAT}")
        base = -(-(_PREFIX.size + header_len) // _ALIGN) * _ALIGN
        try:
            tree = _materialise(header["tree"], mem, base, size)
        except BlobError as exc:
            raise BlobError(f"{_name(path)}: {exc}") from None
    except BaseException:
        mem.close()
        raise
    return Blob(tree=tree, _map=mem)


def _name(path: Path) -> str:
    """A tier file as its line names it: `step_<N>/rank_<R>.blob`."""
    return f"{path.parent.name}/{path.name}"


def _materialise(obj: Any, mem: mmap.mmap, base: int, size: int) -> Any:
    if isinstance(obj, TensorRef):
        dtype = getattr(torch, obj.dtype)  # a dtype name: `wire` checked it
        if base + obj.offset + obj.nbytes > size:
            raise BlobError(f"a tensor entry ({obj.dtype}, {obj.shape}) lies outside the blob's {size} bytes")
        numel = 1
        for dim in obj.shape:
            numel *= dim
        if numel * dtype.itemsize != obj.nbytes:
            raise BlobError(f"a tensor entry ({obj.dtype}, {obj.shape}) says {obj.nbytes} bytes")
        if numel == 0:
            return torch.empty(obj.shape, dtype=dtype)
        return torch.frombuffer(mem, dtype=dtype, count=numel, offset=base + obj.offset).view(obj.shape)
    if isinstance(obj, dict):
        return {k: _materialise(v, mem, base, size) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_materialise(v, mem, base, size) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_materialise(v, mem, base, size) for v in obj)
    return obj


def fits(target: Any, blob: Any, path: str = "") -> str | None:
    """None if every tensor of `blob` has a tensor of the same local shape and dtype at the same place in
    `target` (the live state dict), and the containers match; else the first difference, in a few words."""
    if isinstance(blob, torch.Tensor):
        if not isinstance(target, torch.Tensor):
            return f"{path or '/'}: a tensor in the copy, {type(target).__name__} in the live state"
        local = target.to_local() if isinstance(target, DTensor) else target
        if tuple(local.shape) != tuple(blob.shape) or local.dtype != blob.dtype:
            return (
                f"{path}: local shape {tuple(local.shape)} {_dtype_name(local.dtype)} live, "
                f"{tuple(blob.shape)} {_dtype_name(blob.dtype)} in the copy"
            )
        return None
    if isinstance(blob, dict):
        if not isinstance(target, dict):
            return f"{path or '/'}: a dict in the copy, {type(target).__name__} in the live state"
        if set(blob) != set(target):
            missing = sorted(map(str, set(target) - set(blob)))
            extra = sorted(map(str, set(blob) - set(target)))
            return f"{path or '/'}: keys differ (missing {missing[:3]}, unexpected {extra[:3]})"
        for key, value in blob.items():
            problem = fits(target[key], value, f"{path}/{key}")
            if problem:
                return problem
        return None
    if isinstance(blob, (list, tuple)):
        if not isinstance(target, (list, tuple)) or len(target) != len(blob):
            return f"{path or '/'}: a sequence of {len(blob)} in the copy, not in the live state"
        for i, (t, b) in enumerate(zip(target, blob, strict=True)):
            problem = fits(t, b, f"{path}/{i}")
            if problem:
                return problem
    return None
