"""The checksum path: what the commit record names, old (zlib CRC32) records, and the gathered writer.

Real files and a real model and optimizer (world size 1); the checksums are recomputed here independently
from the bytes on disk.
"""

from __future__ import annotations

import json
import logging
import random
import zlib
from pathlib import Path

import crc32c
import pytest
from test_ckpt_local import _flip_byte, _resume, _train

from training.checkpoint.commit import FileEntry, read_commit, verify_file
from training.checkpoint.layout import step_dir
from training.checkpoint.writer import ChecksumFile


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
    with caplog.at_level(logging.WARNING, logger="training.checkpoint"):
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
