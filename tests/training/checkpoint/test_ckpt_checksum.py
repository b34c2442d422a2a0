"""The checksum path: what the commit record names, old (zlib CRC32) records, and the gathered writer.

Real files and a real model and optimizer (world size 1); the checksums are recomputed here independently
from the bytes on disk.
"""

from __future__ import annotations

import io
import json
import logging
import mmap
import pickle
import random
import zlib
from pathlib import Path

import crc32c
import pytest
import torch
import torch.distributed.checkpoint as dcp
from test_ckpt_local import _flip_byte, _resume, _train

from fsdpkit.resilience.checkpoint import writer as writer_module
from fsdpkit.resilience.checkpoint.commit import FileEntry, read_commit, verify_file
from fsdpkit.resilience.checkpoint.layout import step_dir
from fsdpkit.resilience.checkpoint.staging import HostStager, take
from fsdpkit.resilience.checkpoint.writer import ALIGN, ChecksumFile, KitStorageWriter


def _folder(tmp_path: Path, step: int) -> Path:
    return step_dir(tmp_path / "checkpoints", step)


def test_the_record_names_crc32c_and_it_matches_the_bytes_on_disk(tmp_path: Path) -> None:
    _train(tmp_path, steps=2, mode="async", interval=2)
    folder = _folder(tmp_path, 2)
    body = json.loads((folder / "commit.json").read_text())
    assert set(body["files"]) == {".metadata", "__0_0.distcp"}
    for name, entry in body["files"].items():
        data = (folder / name).read_bytes()
        assert entry == {"size": len(data), "crc32c": crc32c.crc32c(data)}, name


def test_a_record_written_with_zlib_crc32_still_verifies_and_resumes(tmp_path: Path, caplog) -> None:
    _train(tmp_path, steps=3)
    for step in (2, 3):  # rewrite both records as a kit from before crc32c wrote them
        folder = _folder(tmp_path, step)
        body = json.loads((folder / "commit.json").read_text())
        for name in body["files"]:
            data = (folder / name).read_bytes()
            body["files"][name] = {"size": len(data), "crc32": zlib.crc32(data)}
        (folder / "commit.json").write_text(json.dumps(body))
    entry = read_commit(_folder(tmp_path, 3)).files["__0_0.distcp"]
    assert (entry.algo, entry.crc32c) == ("crc32", None)
    assert verify_file(_folder(tmp_path, 3), "__0_0.distcp", entry, checksum=True) is None
    _flip_byte(_folder(tmp_path, 3) / "__0_0.distcp", entry.size // 3)  # same size, other bytes
    with caplog.at_level(logging.WARNING, logger="fsdpkit.resilience.checkpoint"):
        step, app = _resume(tmp_path)
    assert (step, app.step) == (2, 2), "the old step 2 verifies and loads; the flipped step 3 does not"
    assert "step_00000003 skipped: damaged (__0_0.distcp: crc32 " in caplog.text


def test_a_flipped_byte_is_caught_by_crc32c_anywhere_in_the_file(tmp_path: Path) -> None:
    _train(tmp_path, steps=2, interval=2)
    folder = _folder(tmp_path, 2)
    entry = read_commit(folder).files["__0_0.distcp"]
    assert entry.algo == "crc32c"
    for offset in (0, entry.size // 2, entry.size - 1):
        _flip_byte(folder / "__0_0.distcp", offset)
        assert "__0_0.distcp: crc32c " in verify_file(folder, "__0_0.distcp", entry, checksum=True)
        _flip_byte(folder / "__0_0.distcp", offset)  # back
        assert verify_file(folder, "__0_0.distcp", entry, checksum=True) is None


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ({"size": 1}, "exactly one checksum"),
        ({"size": 1, "crc32": 5, "crc32c": 5}, "exactly one checksum"),
        ({"size": 1, "xxh3": 5}, "unknown file entry key(s) xxh3"),
    ],
)
def test_an_entry_without_exactly_one_known_checksum_is_refused(tmp_path: Path, entry, why) -> None:
    _train(tmp_path, steps=3)
    folder = _folder(tmp_path, 3)
    body = json.loads((folder / "commit.json").read_text())
    body["files"]["__0_0.distcp"] = entry
    (folder / "commit.json").write_text(json.dumps(body))
    with pytest.raises(ValueError, match=why.replace("(", r"\(").replace(")", r"\)")):
        read_commit(folder)
    step, _ = _resume(tmp_path)
    assert step == 2, "an unreadable record is a damaged step: resume falls back"


def test_gathered_small_writes_and_direct_large_ones_keep_order_offsets_and_checksum(tmp_path: Path) -> None:
    rng = random.Random(0)
    sizes = [rng.choice([1, 7, 300, 5000, 70_000, 200_000, 1 << 20, 3 << 20]) for _ in range(60)]
    pieces = [rng.randbytes(n) for n in sizes]
    out = ChecksumFile(tmp_path / "f")
    offsets = []
    for piece in pieces:
        offsets.append(out.tell())
        assert out.write(memoryview(piece)) == len(piece)
    entry = out.close()
    data = b"".join(pieces)
    assert (tmp_path / "f").read_bytes() == data
    assert offsets == [sum(sizes[:i]) for i in range(len(sizes))]
    assert entry == FileEntry(size=len(data), crc32c=crc32c.crc32c(data))


def _aligned(n: int, fill: int) -> memoryview:
    """`n` bytes that start on a page (what the stager's host buffers are)."""
    mem = mmap.mmap(-1, n)
    mem.write(bytes([fill]) * n)
    return memoryview(mem)


@pytest.mark.parametrize("direct", [True, False], ids=["o_direct", "page_cache"])
def test_aligned_unaligned_and_tiny_writes_reach_the_file_in_order_with_their_checksum(
    tmp_path: Path, direct: bool
) -> None:
    rng = random.Random(1)
    pieces: list[bytes | memoryview] = []
    for i in range(40):
        kind = rng.choice(["tiny", "bytes", "aligned", "pad"])
        if kind == "tiny":
            pieces.append(rng.randbytes(rng.randint(1, 600)))
        elif kind == "bytes":  # large, at whatever address Python put it
            pieces.append(rng.randbytes(rng.choice([70_000, 1 << 20, (5 << 20) + 3])))
        elif kind == "aligned":  # large, page-aligned memory (a page multiple or not)
            pieces.append(_aligned(rng.choice([ALIGN * 17, (1 << 20) + 1234, 6 << 20]), i))
        else:
            pieces.append(b"pad")
    out = ChecksumFile(tmp_path / "f", direct=direct)
    opened_direct = out.direct  # False where the file system refuses O_DIRECT
    expect = bytearray()
    for piece in pieces:
        if isinstance(piece, bytes) and piece == b"pad":
            out.pad_to(ALIGN)
            expect += bytes(-len(expect) % ALIGN)
            assert out.tell() % ALIGN == 0
            continue
        assert out.tell() == len(expect)
        assert out.write(piece) == len(piece)
        expect += piece
    assert out.direct == opened_direct, "every aligned write was taken as it was (no fallback)"
    entry = out.close()
    assert (tmp_path / "f").read_bytes() == expect
    assert entry == FileEntry(size=len(expect), crc32c=crc32c.crc32c(expect))


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    shapes = {"big": (512, 300), "odd": (1001, 33), "small": (7,), "scalar": ()}
    return {k: torch.randn(s, generator=g) for k, s in shapes.items()} | {"int": torch.arange(40_000)}


def _save(folder: Path, state: dict[str, torch.Tensor], *, direct_io: bool) -> KitStorageWriter:
    writer = KitStorageWriter(folder, direct_io=direct_io)
    dcp.save(state, storage_writer=writer, no_dist=True)
    return writer


@pytest.mark.parametrize("stage", [True, False], ids=["staged_page_aligned", "live_tensors"])
def test_a_shard_written_with_o_direct_loads_back_and_a_flipped_byte_is_caught(tmp_path: Path, stage) -> None:
    """The O_DIRECT layout (large archives start on a page) loads with stock `dcp.load`, equal to the page-
    cache layout of the writer before it; both records verify, and a flipped byte fails the new one."""
    state = _tensors()
    if stage:  # the async kit path: page-aligned host buffers from the stager
        stager = HostStager()
        staged = stager.copy(take(1, state))
        assert staged["big"].data_ptr() % ALIGN == 0
    else:  # sync mode: the live tensors, wherever torch put them
        staged = state
    files = {}
    for direct_io in (True, False):
        folder = tmp_path / f"direct_{direct_io}"
        files[direct_io] = _save(folder, staged, direct_io=direct_io).files
        for name, entry in files[direct_io].items():
            data = (folder / name).read_bytes()
            assert entry == FileEntry(size=len(data), crc32c=crc32c.crc32c(data)), name
            assert verify_file(folder, name, entry, checksum=True) is None
        loaded = {k: torch.zeros_like(v) for k, v in state.items()}
        dcp.load(loaded, checkpoint_id=folder, no_dist=True)
        for key, value in state.items():
            assert torch.equal(loaded[key], value), (direct_io, key)
    shard = files[True]["__0_0.distcp"]
    assert shard.size >= files[False]["__0_0.distcp"].size  # page padding only
    folder = tmp_path / "direct_True"
    for offset in (shard.size // 2, shard.size - 1):
        _flip_byte(folder / "__0_0.distcp", offset)
        assert "__0_0.distcp: crc32c " in verify_file(folder, "__0_0.distcp", shard, checksum=True)
        _flip_byte(folder / "__0_0.distcp", offset)


def test_staging_buffers_start_on_a_page_and_share_a_few_mappings() -> None:
    """Page-aligned (O_DIRECT from memory) without a mapping per tensor (vm.max_map_count is ~65k)."""
    state = {f"t{i}": torch.full((128, 128), float(i)) for i in range(300)}  # 64 KiB each
    maps = Path("/proc/self/maps")
    before = len(maps.read_text().splitlines())
    staged = HostStager().copy(take(1, state))
    assert len(maps.read_text().splitlines()) - before < 10
    for key, value in state.items():
        buf = staged[key]
        assert torch.equal(buf, value) and buf.data_ptr() % ALIGN == 0, key
        assert buf.untyped_storage().nbytes() == buf.nbytes, "its own storage (saved without a clone)"


def _serialized(tensor: torch.Tensor, alignment: int) -> bytes:
    """What torch's own serializer writes for `tensor` (zip CRC off, as the writer runs it)."""
    out = io.BytesIO()
    writer = torch._C.PyTorchFileWriter(out, False, alignment)
    torch.serialization._save(tensor, writer, pickle, torch.serialization.DEFAULT_PROTOCOL, False)
    writer.write_end_of_file()
    return out.getvalue()


@pytest.mark.parametrize("direct", [True, False], ids=["o_direct", "page_cache"])
def test_a_cached_archive_writes_the_bytes_torchs_serializer_writes_for_any_values(
    tmp_path: Path, direct: bool
) -> None:
    """The writer makes a tensor's zip archive once per metadata and reuses it: the file must hold, byte for
    byte, what torch's serializer writes for the values of each save (new values, same metadata), and load
    back with `torch.load`."""
    alignment = torch.serialization._get_storage_alignment()
    shapes = [
        torch.randn(3, 4),
        torch.randn(300, 400).t(),  # not contiguous, its whole storage
        torch.randn(64, 1024).to(torch.bfloat16),  # >= 64 KiB: page-aligned with O_DIRECT
        torch.tensor(3.5),
        torch.arange(10),
        torch.rand(7) > 0.5,
    ]
    for save in range(3):
        tensors = [t.clone() if save == 0 else torch.empty_like(t).copy_(t * (save + 1)) for t in shapes]
        out = ChecksumFile(tmp_path / f"shard{save}", direct=direct)
        offsets = [writer_module._write_tensor(out, t, alignment) for t in tensors]
        direct_now = out.direct
        out.close()
        data = (tmp_path / f"shard{save}").read_bytes()
        for tensor, start, end in zip(tensors, offsets, [*offsets[1:], len(data)], strict=True):
            big = direct_now and tensor.nbytes >= 64 << 10
            expected = _serialized(tensor, max(alignment, ALIGN) if big else alignment)
            assert data[start : start + len(expected)] == expected, (save, tensor.shape)
            assert not any(data[start + len(expected) : end]), "only zero padding up to the next archive"
            back = torch.load(io.BytesIO(data[start:end]), weights_only=True)
            assert torch.equal(back, tensor) and back.stride() == tensor.stride(), (save, tensor.shape)
            cached = writer_module._archive(tensor, max(alignment, ALIGN) if big else alignment)
            assert cached is not None, "written from the cached archive, not by the serializer"
