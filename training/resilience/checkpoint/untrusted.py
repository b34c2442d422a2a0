"""Loaders for checkpoint bytes that another run could have written: they build only what the kit writes.

A step folder on shared storage proves its integrity with its commit record (sizes and CRCs), never its
origin: any pod that can write the run folder can plant a `step_N` with a correct `commit.json`. DCP reads
two kinds of bytes with pickle (torch 2.11 to 2.15): `FileSystemReader.read_metadata` unpickles `.metadata`
with `pickle.load`, and `DefaultLoadPlanner.load_bytes` loads every non-tensor item (the step, a parameter
group's numbers, a data position) with `torch.load(weights_only=False)`. Either runs whatever a pickle asks
for. Here:

- `.metadata` goes through `MetadataUnpickler`, an allowlisted unpickler: DCP's metadata classes,
  `torch.Size`, dtypes and layouts, `pathlib.PosixPath` (the checkpoint id DCP records), `OrderedDict`, and
  the containers and scalars pickle builds without importing anything. Metadata has to stay a pickle (DCP
  writes and reads it; the kit's writer keeps DCP's layout so that `dcp.load` and torch's tools read the kit's
  checkpoints), so the unpickler is the narrowest loader that still reads it.
- byte items go through `torch.load(weights_only=True)`: torch's own allowlisted unpickler (tensors, plain
  containers, numbers, strings, `torch.Size`, dtypes), with no extra safe globals: the kit writes nothing
  else there (`SafeLoadPlanner`).

A refusal is `Refused`: one line naming the file and the refused type; resume treats the step as damaged.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from collections import OrderedDict
from pathlib import Path, PosixPath, PurePosixPath
from typing import IO, Any

import torch
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem
from typing_extensions import override

from fsdpkit.runtime import torch_internals as internals


class Refused(ValueError):
    """Bytes that would build a type the kit never writes (or are no pickle at all); one line."""


_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name): getattr(dcp_metadata, name)
    for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata",
    )
}  # fmt: skip
_ALLOWED: dict[tuple[str, str], Any] = {
    **_METADATA_CLASSES,
    **internals.metadata_privates(),
    ("torch", "Size"): torch.Size,
    ("pathlib", "PosixPath"): PosixPath,
    ("pathlib", "PurePosixPath"): PurePosixPath,
    ("collections", "OrderedDict"): OrderedDict,
}
"""(module, name) -> object: everything `.metadata` may import. Each is data or a constructor that only
stores its arguments (dataclasses, an enum, `torch.Size`, a path, a dict)."""
_TORCH_VALUES = (torch.dtype, torch.layout, torch.memory_format)
"""`torch.<name>` is allowed when it is one of these values (`torch.float32` is pickled by name)."""


def _torch_value(name: str) -> Any:
    value = getattr(torch, name, None) if name.isidentifier() else None
    return value if isinstance(value, _TORCH_VALUES) else None


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP `.metadata` and refuses any global outside `_ALLOWED` before importing it."""

    def __init__(self, file: IO[bytes], where: str) -> None:
        super().__init__(file)
        self.where = where

    @override
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module == "torch" and (value := _torch_value(name)) is not None:
            return value
        raise Refused(f"{self.where}: refused type {module}.{name} (DCP metadata holds none)")

    @override
    def persistent_load(self, pid: Any) -> Any:
        raise Refused(f"{self.where}: refused a persistent id (DCP metadata holds none)")


def load_metadata(data: IO[bytes], where: str) -> Metadata:
    """DCP metadata from `data` through the allowlisted unpickler; Refused (one line) for anything else."""
    try:
        metadata = MetadataUnpickler(data, where).load()
    except Refused:
        raise
    except Exception as exc:  # a damaged pickle raises anything: one line, whatever it is
        raise Refused(f"{where}: not DCP metadata ({type(exc).__name__}: {_line(exc)})") from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
        raise Refused(f"{where}: refused type {type(metadata).__qualname__} (not DCP metadata)")
    return metadata


def read_metadata_file(path: Path) -> Metadata:
    """A step folder's `.metadata`, through `load_metadata`."""
    with open(path, "rb") as fh:
        return load_metadata(fh, str(path))


_UNSUPPORTED = re.compile(r"[Uu]nsupported (?:global: )?GLOBAL ([\w.]+)|Unsupported operand (\S+)")
"""How torch's weights_only unpickler names what it refused (torch 2.13: `Unsupported global: GLOBAL
getattr was not an allowed global`, `Trying to load unsupported GLOBAL posix.system whose module posix is
blocked`)."""


def load_byte_item(data: IO[bytes], where: str) -> Any:
    """A byte item (what `torch.save` wrote for a non-tensor value) through `weights_only=True`; Refused
    naming the type it would have built."""
    try:
        return torch.load(data, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = _UNSUPPORTED.search(str(exc))
        what = next((g for g in found.groups() if g), "?") if found else _line(exc)
        raise Refused(f"{where}: refused type {what} (byte items hold plain values only)") from None
    except Exception as exc:  # a damaged archive
        raise Refused(f"{where}: not a byte item ({type(exc).__name__}: {_line(exc)})") from None


def _line(exc: BaseException) -> str:
    """An exception's text on one short line."""
    return " ".join(str(exc).split())[:200]


class SafeReader(FileSystemReader):
    """DCP's file system reader with `.metadata` read through the allowlisted unpickler."""

    @override
    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        path = self.fs.concat_path(self.path, name)
        with self.fs.create_stream(path, "rb") as stream:
            metadata = load_metadata(stream, os.fspath(path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner with byte items loaded through `load_byte_item` (`weights_only=True`)."""

    def __init__(self, folder: str | os.PathLike[str] = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.folder = os.fspath(folder)

    def _where(self, read_item: ReadItem) -> str:
        info = self.metadata.storage_data.get(read_item.storage_index) if self.metadata else None
        file = getattr(info, "relative_path", "?")
        return f"{os.path.join(self.folder, file)} (byte item {read_item.dest_index.fqn})"

    @override
    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        obj = load_byte_item(value, self._where(read_item))
        if self.flatten_state_dict:
            internals.set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj
