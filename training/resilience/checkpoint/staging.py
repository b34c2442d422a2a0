"""Host staging for async saves: copy EVERY tensor of the state into host buffers allocated once.

The training thread only takes the state (`take`: `state_dict()` of each Stateful, deep copies of the
small non-tensor leaves, references to the tensors). The copy (`copy`) runs on the writer thread into
buffers that are allocated on the first save and reused by every later one (pinned memory on CUDA, so
device-to-host copies are asynchronous DMA on a side stream). CPU tensors are copied too: an optimizer
step after the save must never reach the checkpoint. Until the copy is done, the checkpointer holds
every `optimizer.step()` (see `Checkpointer`), so the copy overlaps forward and backward.

With memory tiers, the copy goes straight into the tier's blob (`copy(..., into=...)`: one host tensor per
tensor of the state, views into the blob file's map; see `blob.stage_blob`) and the stager's own buffers
are freed: the host copy that the shard is written from and that an in-process restart restores is then
the tier's copy itself, and the tier costs no second copy.
"""

from __future__ import annotations

import contextlib
import copy
import mmap
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor

from fsdpkit.resilience.checkpoint.guard import SaveGuard, test_delay_s

_PAGE_ALIGNED_FROM = 64 << 10
"""CPU staging buffers of at least this many bytes start on a page (`_PageArena`); smaller tensors go
through the writer's own buffer anyway."""


@dataclass
class _Leaf:
    """Placeholder for the i-th tensor of a taken state."""

    index: int


@dataclass
class TakenState:
    """A state at one step: the tree with tensor placeholders, and the live tensors to copy."""

    step: int
    tree: dict[str, Any]
    tensors: list[torch.Tensor]
    paths: list[str]
    ready_event: Any = None
    """CUDA event recorded on the training stream when the state was taken (None on CPU)."""

    def live_tree(self) -> dict[str, Any]:
        """The tree with the live tensors in place (for their shapes; before `copy`, which drops them)."""
        return _fill(self.tree, self.tensors)


def _walk(obj: Any, path: str, tensors: list[torch.Tensor], paths: list[str]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        paths.append(path)
        return _Leaf(len(tensors) - 1)
    if isinstance(obj, dict):
        return {k: _walk(v, f"{path}/{k}", tensors, paths) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_walk(v, f"{path}/{i}", tensors, paths) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return tuple(_walk(v, f"{path}/{i}", tensors, paths) for i, v in enumerate(obj))
    return copy.deepcopy(obj)


def _fill(obj: Any, values: list[Any]) -> Any:
    if isinstance(obj, _Leaf):
        return values[obj.index]
    if isinstance(obj, dict):
        return {k: _fill(v, values) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fill(v, values) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_fill(v, values) for v in obj)
    return obj


def flatten_state(state: dict[str, Any]) -> dict[str, Any]:
    """What `dcp.save` would write: each Stateful replaced by its `state_dict()`."""
    return {k: (v.state_dict() if isinstance(v, Stateful) else v) for k, v in state.items()}


def take(step: int, state: dict[str, Any]) -> TakenState:
    """Training thread: the state's structure now, with references to its tensors (no copy yet)."""
    tensors: list[torch.Tensor] = []
    paths: list[str] = []
    tree = _walk(flatten_state(state), "", tensors, paths)
    event = None
    if any(t.is_cuda for t in tensors):
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream())
    return TakenState(step=step, tree=tree, tensors=tensors, paths=paths, ready_event=event)


@dataclass
class _Slot:
    buffer: torch.Tensor
    staged: torch.Tensor
    """What goes into the staged tree: the buffer itself, or a DTensor around it (same mesh/placements)."""
    key: tuple[Any, ...]


def _slot_key(t: torch.Tensor) -> tuple[Any, ...]:
    if isinstance(t, DTensor):
        local = t.to_local()
        return ("d", local.shape, local.dtype, t.shape, t.stride(), t.placements, id(t.device_mesh))
    return ("t", t.shape, t.dtype)


def _anonymous(size: int) -> mmap.mmap:
    """Private anonymous memory, as malloc's (Python's default, MAP_SHARED, would be shmem)."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


class _PageArena:
    """Page-aligned host memory for staging buffers, carved from a few large anonymous mappings.

    Why page-aligned: the writer then sends a buffer to the device with O_DIRECT as it is (torch's
    allocator aligns to 64 bytes only). Why not one mapping per tensor: a process may hold only ~65k
    mappings (vm.max_map_count), and a large sharded model has hundreds of thousands of tensors per rank.
    Each tensor has a storage of exactly its own bytes and keeps its mapping alive; a mapping is unmapped
    once no tensor uses it, and pages never written are never resident."""

    def __init__(self, chunk_bytes: int = 256 << 20) -> None:
        self._chunk = chunk_bytes
        self._map: mmap.mmap | None = None
        self._used = 0

    def empty(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        numel = shape.numel()
        size = -(-numel * dtype.itemsize // mmap.PAGESIZE) * mmap.PAGESIZE
        if size > self._chunk:
            mem, offset = _anonymous(size), 0
        else:
            if self._map is None or self._used + size > self._chunk:
                self._map, self._used = _anonymous(self._chunk), 0
            mem, offset = self._map, self._used
            self._used += size
        return torch.frombuffer(mem, dtype=dtype, count=numel, offset=offset).view(shape)


def _as_staged(src: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    """What goes into the staged tree for `src` copied into `buffer`: the buffer, or a DTensor around it
    (same mesh and placements)."""
    if isinstance(src, DTensor):
        return DTensor.from_local(
            buffer, src.device_mesh, src.placements, run_check=False, shape=src.shape, stride=src.stride()
        )
    return buffer


class HostStager:
    """Reusable host buffers, one per tensor path; `nbytes` is the staging memory held."""

    def __init__(self) -> None:
        self._slots: dict[str, _Slot] = {}
        self._arena = _PageArena()
        self._stream: Any = None
        self.last: dict[str, Any] | None = None
        """The last staged tree (tensor leaves are the host buffers)."""
        self.last_step: int | None = None

    @property
    def nbytes(self) -> int:
        return sum(s.buffer.nbytes for s in self._slots.values())

    def _slot(self, path: str, src: torch.Tensor) -> _Slot:
        key = _slot_key(src)
        slot = self._slots.get(path)
        if slot is not None and slot.key == key:
            return slot
        local = src.to_local() if isinstance(src, DTensor) else src
        if local.is_cuda:  # pinned: device-to-host copies are DMA (cudaHostAlloc memory is page-aligned)
            buffer = torch.empty(local.shape, dtype=local.dtype, device="cpu", pin_memory=True)
        elif local.nbytes >= _PAGE_ALIGNED_FROM:
            buffer = self._arena.empty(local.shape, local.dtype)
        else:
            buffer = torch.empty(local.shape, dtype=local.dtype, device="cpu")
        slot = _Slot(buffer=buffer, staged=_as_staged(src, buffer), key=key)
        self._slots[path] = slot
        return slot

    def copy(
        self, taken: TakenState, guard: SaveGuard | None = None, *, into: list[torch.Tensor] | None = None
    ) -> dict[str, Any]:
        """Writer thread: copy every tensor into its buffer, or into `into` (host tensors of the local
        shapes, in `take` order: the memory tier's blob); returns the staged tree (DCP-saveable). Raises
        SaveAbandoned between tensors once the save is abandoned (the copy then stays torn)."""
        self.last, self.last_step = None, None  # torn while copying
        if into is not None and self._slots:
            self.close()  # its own buffers: freed while the copies go into the tier's memory
        values: list[Any] = []
        delay_s = test_delay_s()
        cuda = taken.ready_event is not None
        if cuda and self._stream is None:
            self._stream = torch.cuda.Stream()
        ctx = torch.cuda.stream(self._stream) if cuda else contextlib.nullcontext()
        with ctx:
            if cuda:
                self._stream.wait_event(taken.ready_event)
            for i, (path, src) in enumerate(zip(taken.paths, taken.tensors, strict=True)):
                if delay_s:
                    time.sleep(delay_s)
                if guard is not None:
                    guard.check()
                local = src.to_local() if isinstance(src, DTensor) else src
                if into is None:
                    slot = self._slot(path, src)
                    buffer, staged = slot.buffer, slot.staged
                else:
                    buffer = into[i]
                    staged = _as_staged(src, buffer)
                buffer.copy_(local.detach(), non_blocking=local.is_cuda)
                values.append(staged)
        if cuda:
            self._stream.synchronize()
        taken.tensors.clear()  # drop references to live tensors
        tree = _fill(taken.tree, values)
        self.last, self.last_step = tree, taken.step
        return tree

    def close(self) -> None:
        self._slots.clear()
        self._arena = _PageArena()
        self.last, self.last_step = None, None


def restore_into(state: dict[str, Any], staged: dict[str, Any]) -> None:
    """Copy a staged tree back into live state, the way `dcp.load` does (in place, then load_state_dict)."""
    for key, obj in state.items():
        if isinstance(obj, Stateful):
            target = obj.state_dict()
            merged = _copy_tree(target, staged[key])
            obj.load_state_dict(merged)
        elif isinstance(obj, torch.Tensor):
            _copy_tensor(obj, staged[key])
        else:
            raise TypeError(f"state[{key!r}] is {type(obj).__name__}; expected a Stateful or a tensor")


def _copy_tensor(dst: torch.Tensor, src: torch.Tensor) -> None:
    d = dst.to_local() if isinstance(dst, DTensor) else dst
    s = src.to_local() if isinstance(src, DTensor) else src
    d.detach().copy_(s)


def _copy_tree(target: Any, staged: Any) -> Any:
    if isinstance(staged, torch.Tensor):
        if isinstance(target, torch.Tensor):
            _copy_tensor(target, staged)
            return target
        local = staged.to_local() if isinstance(staged, DTensor) else staged
        return local.clone()
    if isinstance(staged, dict):
        base = target if isinstance(target, dict) else {}
        return {k: _copy_tree(base.get(k), v) for k, v in staged.items()}
    if isinstance(staged, (list, tuple)):
        base = (
            target
            if isinstance(target, (list, tuple)) and len(target) == len(staged)
            else [None] * len(staged)
        )
        out = [_copy_tree(b, v) for b, v in zip(base, staged, strict=True)]
        return type(staged)(out)
    return copy.deepcopy(staged)
