"""The commit record: written last, by one rank, after every shard is durable; and its verification.

A step folder counts only with a `commit.json` whose files all match: sizes always, CRC32 checksums
when asked. The checksums come from the writer (computed while the bytes went out), so saving never
re-reads a shard; verification at resume reads each file once.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from training.checkpoint.layout import COMMIT_FILE, fsync_dir

FORMAT = "kit-dcp-commit/1"
_READ_CHUNK = 8 << 20


@dataclass(frozen=True, kw_only=True)
class FileEntry:
    size: int
    """Bytes in the file."""
    crc32: int
    """zlib CRC32 of the whole file."""


@dataclass(frozen=True, kw_only=True)
class CommitRecord:
    step: int
    world_size: int
    files: dict[str, FileEntry]
    """File name (relative to the step folder) -> size and checksum; every file of the checkpoint."""
    created: float = field(default_factory=time.time)
    format: str = FORMAT

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files.values())

    def to_json(self) -> str:
        body = asdict(self)
        body["files"] = {k: asdict(v) for k, v in sorted(self.files.items())}
        return json.dumps(body, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CommitRecord:
        body = json.loads(text)
        if body.get("format") != FORMAT:
            raise ValueError(f"unknown commit format {body.get('format')!r} (expected {FORMAT})")
        files = {
            name: FileEntry(size=int(e["size"]), crc32=int(e["crc32"])) for name, e in body["files"].items()
        }
        return cls(
            step=int(body["step"]),
            world_size=int(body["world_size"]),
            files=files,
            created=float(body["created"]),
        )


def write_commit(folder: Path, record: CommitRecord) -> None:
    """Atomically publish the record: temp file, fsync, rename, fsync the folder."""
    tmp = folder / (COMMIT_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(record.to_json())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, folder / COMMIT_FILE)
    fsync_dir(folder)


def read_commit(folder: Path) -> CommitRecord:
    """The step's record; raises OSError / ValueError when it is missing or unreadable."""
    return CommitRecord.from_json((folder / COMMIT_FILE).read_text(encoding="utf-8"))


def file_crc32(path: Path) -> int:
    crc = 0
    buf = bytearray(_READ_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            crc = zlib.crc32(view[:n], crc)
    return crc


def verify_file(folder: Path, name: str, entry: FileEntry, *, checksum: bool) -> str | None:
    """None if the file matches its record, else a short reason."""
    path = folder / name
    try:
        size = path.stat().st_size
    except OSError as exc:
        return f"{name}: missing ({exc.strerror})"
    if size != entry.size:
        return f"{name}: size {size} != recorded {entry.size}"
    if checksum:
        try:
            crc = file_crc32(path)
        except OSError as exc:
            return f"{name}: unreadable ({exc.strerror})"
        if crc != entry.crc32:
            return f"{name}: crc32 {crc:08x} != recorded {entry.crc32:08x}"
    return None
