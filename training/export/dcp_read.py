"""A committed DCP checkpoint read tensor by tensor, without DCP's loader (which fills a whole state dict).

DCP's `.metadata` says, for every tensor, its full shape and dtype and its chunks (offsets and sizes in the
full tensor), and for every chunk the file (`__<rank>_0.distcp`) and the byte range of its record. The kit's
writer (fsdpkit.resilience.checkpoint.writer) stores each record as one torch zip archive of a tensor
whose storage holds exactly its bytes, uncompressed: so a chunk's bytes can be read in place, piece by
piece, once the archive says where its storage record starts and that the tensor is contiguous.

Two reads of torch-serialized bytes, each in one function and neither a general unpickler: `read_metadata`
(the `.metadata` pickle, through the kit's allowlisted unpickler, fsdpkit.resilience.checkpoint.untrusted)
and `_archive_tensor` (a record's tensor description, with torch's allowlisted `weights_only` loader onto
the meta device: no data is read).
"""

from __future__ import annotations

import io
import math
import os
import struct
import sys
import zipfile
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from fsdpkit.export.errors import ExportError
from fsdpkit.resilience.checkpoint.resume import one_line
from fsdpkit.resilience.checkpoint.untrusted import Refused, read_metadata_file
from fsdpkit.resilience.session import STATE_KEY

MODEL_KEY = "model"
"""The TrainState's key for the model's state dict (fsdpkit.resilience.state): its own parameter names."""
PIECE_BYTES = 8 << 20
"""Bytes read, converted and written at a time: what bounds the export's memory on the fast path."""
_OPEN_FILES = 64
"""Rank files kept open at once (least recently used closed first): a 512-rank checkpoint stays under any
descriptor limit."""
_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")
"""A zip local file header (30 bytes): signature ... file name length, extra field length."""
_LOCAL_SIGNATURE = 0x04034B50


@dataclass(frozen=True)
class Chunk:
    """One stored piece of a tensor: where it sits in the full tensor and where its record is."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str
    """The rank file, relative to the step folder."""
    start: int
    """The record's first byte in the file."""
    length: int

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)


@dataclass(frozen=True)
class StoredTensor:
    """A model tensor of the checkpoint: its name in the model's state dict, dtype, full shape, chunks."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    chunks: tuple[Chunk, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def read_metadata(folder: Path) -> Metadata:
    """The step's DCP `.metadata`, through the allowlisted unpickler (DCP's metadata classes and plain
    values only: a checkpoint folder is shared storage another run could have written)."""
    try:
        return read_metadata_file(folder / ".metadata")
    except Refused as exc:
        raise ExportError(f"{exc}: not a checkpoint the kit wrote") from None
    except OSError as exc:
        raise ExportError(f"{folder}/.metadata cannot be read ({one_line(exc)})") from None


def _model_name(key: str, path: Any) -> str | None:
    """The model's own parameter name of a flattened checkpoint key, or None for anything else (optimizer
    state, data position, RNG, step). `path` is DCP's record of the key's place in the nested state."""
    if isinstance(path, tuple) and len(path) >= 3 and path[:2] == (STATE_KEY, MODEL_KEY):
        return ".".join(str(p) for p in path[2:])
    prefix = f"{STATE_KEY}.{MODEL_KEY}."
    return key[len(prefix) :] if path is None and key.startswith(prefix) else None


def model_tensors(folder: Path) -> list[StoredTensor]:
    """Every tensor of the model's state dict in the checkpoint, in the order it was saved (the model's)."""
    md = read_metadata(folder)
    if not isinstance(md, Metadata) or not isinstance(md.storage_data, dict):
        raise ExportError(f"{folder}/.metadata is not a DCP checkpoint's metadata")
    paths = md.planner_data if isinstance(md.planner_data, dict) else {}
    located = {(index.fqn, tuple(index.offset or ())): info for index, info in md.storage_data.items()}
    found = []
    for key, entry in md.state_dict_metadata.items():
        name = _model_name(key, paths.get(key))
        if name is None or not isinstance(entry, TensorStorageMetadata):
            continue
        chunks = []
        for chunk in entry.chunks:
            info = located.get((key, tuple(chunk.offsets)))
            if info is None:
                raise ExportError(
                    f"{folder}/.metadata lists a chunk of {name} at {list(chunk.offsets)} "
                    "but no file holds it: a damaged checkpoint"
                )
            if getattr(info, "transform_descriptors", None):
                used = ", ".join(info.transform_descriptors)
                raise ExportError(
                    f"{name} was saved through DCP storage transforms ({used}): kit-export-hf reads "
                    "the kit's plain checkpoints"
                )
            chunks.append(
                Chunk(
                    tuple(chunk.offsets),
                    tuple(chunk.sizes),
                    str(info.relative_path),
                    int(info.offset),
                    int(info.length),
                )
            )
        found.append(StoredTensor(name, entry.properties.dtype, tuple(entry.size), tuple(chunks)))
    if not found:
        raise ExportError(
            f"{folder} holds no model tensors under '{STATE_KEY}.{MODEL_KEY}': not a checkpoint of the kit's "
            "TrainState (fsdpkit.resilience)"
        )
    return found


class _FileSlice(io.RawIOBase):
    """A read-only, seekable view of bytes [start, start + length) of an open file (one DCP record)."""

    def __init__(self, fd: int, start: int, length: int) -> None:
        super().__init__()
        self._fd, self._start, self._length, self._pos = fd, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._length - self._pos))
        got = os.preadv(self._fd, [view[:n]], self._start + self._pos) if n else 0
        self._pos += got
        return got


def _archive_tensor(record: _FileSlice) -> torch.Tensor:
    """The record's tensor on the meta device (dtype, shape, strides, storage size; no data read), by
    torch's allowlisted `weights_only` loader."""
    tensor = torch.load(record, map_location="meta", weights_only=True)
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"the record holds a {type(tensor).__name__}, not a tensor")
    return tensor


def _entry_start(fd: int, start: int, entry: zipfile.ZipInfo) -> int:
    """Where an archive entry's bytes start in the record (after its local header; the writer pads there)."""
    fields = _LOCAL_HEADER.unpack(os.pread(fd, _LOCAL_HEADER.size, start + entry.header_offset))
    if fields[0] != _LOCAL_SIGNATURE:
        raise ValueError("a zip entry without its local header")
    return entry.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10]


def _storage_record(record: _FileSlice, fd: int, start: int) -> tuple[int, int]:
    """(offset of the storage's first byte in the record, its size): the archive's one `data/<key>`
    entry, stored uncompressed; its byte order little-endian. Entries are read in place: the kit's writer
    turns the zip's per-entry CRC off, which Python's zipfile would check."""
    entries = zipfile.ZipFile(record).infolist()
    storage = [i for i in entries if i.filename.rsplit("/", 2)[-2:-1] == ["data"]]
    if len(storage) != 1 or storage[0].compress_type != zipfile.ZIP_STORED:
        raise ValueError("not one uncompressed tensor storage")
    for entry in entries:
        if entry.filename.endswith("/byteorder") and entry.file_size <= 16:
            where = start + _entry_start(fd, start, entry)
            if os.pread(fd, entry.file_size, where).strip() != b"little":
                raise ValueError("a big-endian record")
    return _entry_start(fd, start, storage[0]), storage[0].file_size


@dataclass(frozen=True)
class _Layout:
    data_start: int
    """The chunk's first byte in its file (absolute)."""
    in_place: bool
    """Its bytes are the chunk itself, row-major: they can be streamed as they lie."""


class ChunkReader:
    """Reads chunks of one step folder: in place, piece by piece, into one reused buffer (`pieces`), or
    whole (`load`, for a chunk that is not stored row-major). Use as a context manager (closes files)."""

    def __init__(self, folder: Path, *, piece_bytes: int = PIECE_BYTES) -> None:
        if sys.byteorder != "little":
            raise ExportError(
                "kit-export-hf writes little-endian safetensors: run it on a little-endian host"
            )
        self.folder = folder
        self._files: OrderedDict[str, int] = OrderedDict()
        self._buf = bytearray(piece_bytes)

    def __enter__(self) -> ChunkReader:
        return self

    def __exit__(self, *exc: object) -> None:
        while self._files:
            os.close(self._files.popitem()[1])

    def _fd(self, name: str) -> int:
        if name in self._files:
            self._files.move_to_end(name)
            return self._files[name]
        try:
            fd = os.open(self.folder / name, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise ExportError(f"{self.folder / name}: cannot be read ({exc.strerror})") from None
        self._files[name] = fd
        if len(self._files) > _OPEN_FILES:
            os.close(self._files.popitem(last=False)[1])
        return fd

    def _record(self, chunk: Chunk) -> tuple[int, _FileSlice]:
        fd = self._fd(chunk.file)
        return fd, _FileSlice(fd, chunk.start, chunk.length)

    def _where(self, name: str, chunk: Chunk) -> str:
        return f"{chunk.file} at byte {chunk.start} ({name}{list(chunk.offsets)})"

    def layout(self, name: str, chunk: Chunk, dtype: torch.dtype) -> _Layout:
        """Where the chunk's bytes start, checked against `.metadata` (dtype, shape, size)."""
        fd, record = self._record(chunk)
        try:
            tensor = _archive_tensor(record)
            offset, size = _storage_record(record, fd, chunk.start)
        except Exception as exc:  # zip, pickle and torch errors alike: the record is not what DCP wrote
            raise ExportError(
                f"{self._where(name, chunk)} is not a tensor record ({one_line(exc)})"
            ) from None
        if tensor.dtype != dtype or tuple(tensor.shape) != chunk.sizes:
            raise ExportError(
                f"{self._where(name, chunk)} holds {tensor.dtype} {list(tensor.shape)}, .metadata says "
                f"{dtype} {list(chunk.sizes)}: a damaged checkpoint"
            )
        if size != tensor.untyped_storage().nbytes() or offset + size > chunk.length:
            raise ExportError(f"{self._where(name, chunk)}: its storage record is {size} bytes long")
        in_place = (
            tensor.is_contiguous() and tensor.storage_offset() == 0 and size == chunk.numel * dtype.itemsize
        )
        return _Layout(chunk.start + offset, in_place)

    def load(self, chunk: Chunk) -> torch.Tensor:
        """The whole chunk as a tensor (torch's allowlisted loader): for one not stored row-major."""
        _, record = self._record(chunk)
        return torch.load(record, map_location="cpu", weights_only=True)

    def pieces(self, name: str, chunk: Chunk, dtype: torch.dtype) -> Iterator[torch.Tensor]:
        """The chunk's elements in row-major order, as 1-D tensors of at most `piece_bytes`. A piece read in
        place lives in the reader's buffer: use it before asking for the next."""
        if not chunk.numel:
            return
        layout = self.layout(name, chunk, dtype)
        if not layout.in_place:
            flat = self.load(chunk).contiguous().reshape(-1)
            step = max(1, len(self._buf) // dtype.itemsize)
            for i in range(0, flat.numel(), step):
                yield flat[i : i + step]
            return
        fd = self._fd(chunk.file)
        item = dtype.itemsize
        step = max(item, len(self._buf) // item * item)
        pos, left = layout.data_start, chunk.numel * item
        while left:
            n = min(step, left)
            view = memoryview(self._buf)[:n]
            done = 0
            while done < n:
                got = os.preadv(fd, [view[done:]], pos + done)
                if got == 0:
                    raise ExportError(f"{self._where(name, chunk)}: the file ends early")
                done += got
            yield torch.frombuffer(self._buf, dtype=dtype, count=n // item)
            pos, left = pos + n, left - n
