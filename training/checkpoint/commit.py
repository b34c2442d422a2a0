"""The commit record: written last, by one rank, after every shard is durable; and its verification.

A step folder counts only with a `commit.json` that lists exactly the files of its world size
(`.metadata` plus one `__<rank>_0.distcp` per rank: `expected_files`) and whose files all match: sizes
always, CRC32 checksums when asked. The commit refuses any other file set (`merge_rank_files`), and resume
refuses a record that lists one (`file_set_problem`). The checksums come from the writer (computed while
the bytes went out), so saving never re-reads a shard; verification at resume reads each file once.
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
METADATA_FILE = ".metadata"
_READ_CHUNK = 8 << 20


class CommitRefused(ValueError):
    """The ranks' files are not one complete checkpoint of the world size; one line saying why."""


def shard_name(rank: int) -> str:
    """The one file DCP writes for `rank` (single file per rank)."""
    return f"__{rank}_0.distcp"


def expected_files(world_size: int) -> set[str]:
    """Every file a checkpoint of `world_size` ranks has: `.metadata` and one shard per rank."""
    return {METADATA_FILE} | {shard_name(r) for r in range(world_size)}


def file_set_problem(names: set[str], world_size: int) -> str | None:
    """None if `names` is exactly the file set of `world_size` ranks, else what is missing or extra."""
    want = expected_files(world_size)
    if names == want:
        return None
    missing, extra = sorted(want - names), sorted(names - want)
    parts = [f"lists {len(names & want)} of the {len(want)} files of a {world_size}-rank checkpoint"]
    if missing:
        parts.append(f"missing {', '.join(missing)}")
    if extra:
        parts.append(f"unexpected {', '.join(extra)}")
    return "; ".join(parts)


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
        body = json.loads(text, object_pairs_hook=_refuse_duplicate_keys)
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


def _refuse_duplicate_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """json.loads keeps the last of two equal keys silently; a record naming a file twice is damaged."""
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"{key!r} is listed twice")
        out[key] = value
    return out


def merge_rank_files(per_rank: list[dict[str, FileEntry]], world_size: int) -> dict[str, FileEntry]:
    """The checkpoint's files from every rank's report; CommitRefused unless there is one report per
    rank and rank r wrote exactly its own shard (plus `.metadata` on rank 0): `expected_files`."""
    if len(per_rank) != world_size:
        raise CommitRefused(f"{len(per_rank)} ranks reported files, the world size is {world_size}")
    files: dict[str, FileEntry] = {}
    for rank, reported in enumerate(per_rank):
        want = {shard_name(rank)} | ({METADATA_FILE} if rank == 0 else set())
        if set(reported) != want:
            raise CommitRefused(
                f"rank {rank} wrote {', '.join(sorted(reported)) or 'nothing'}, expected "
                f"{', '.join(sorted(want))} (a save that ran without its process group?)"
            )
        files.update(reported)
    return files


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
