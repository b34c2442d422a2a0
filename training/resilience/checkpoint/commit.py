"""The commit record: written last, by one rank, after every shard is durable; and its verification.

A step folder counts only with a `commit.json` that lists exactly the files of its world size
(`.metadata` plus one `__<rank>_0.distcp` per rank: `expected_files`) and whose files all match: sizes
always, checksums when asked. The commit refuses any other file set (`merge_rank_files`), and resume
refuses a record that lists one (`file_set_problem`). The checksums come from the writer (computed while
the bytes went out), so saving never re-reads a shard; verification at resume reads each file once.

Each file entry names its checksum by its key: `crc32c` (CRC-32C, Castagnoli: hardware CRC instructions
through the `crc32c` package, ~15 GB/s on one core here against zlib's ~4, GIL released) is what the writer
records; `crc32` (zlib) is what records written before it hold, and they still verify. A CRC detects every
flipped byte and every burst of up to 32 bits; CRC-32C is also the checksum S3 can verify natively.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import crc32c

from fsdpkit.resilience.checkpoint.layout import COMMIT_FILE, fsync_dir
from fsdpkit.resilience.checkpoint.shared_reads import SharedReads

FORMAT = "kit-dcp-commit/1"
METADATA_FILE = ".metadata"
_READ_CHUNK = 8 << 20

CHECKSUMS: dict[str, Callable[[object, int], int]] = {"crc32c": crc32c.crc32c, "crc32": zlib.crc32}
"""Checksum name (its key in a file entry) -> running update `f(data, previous) -> value`, from 0."""
WRITTEN_CHECKSUM = "crc32c"
"""What the writer records for every new file."""


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
    """One file of a checkpoint: its size and exactly one checksum of the whole file."""

    size: int
    """Bytes in the file."""
    crc32c: int | None = None
    """CRC-32C of the whole file (what the writer records), or None."""
    crc32: int | None = None
    """zlib CRC32 of the whole file (records written before crc32c), or None."""

    def __post_init__(self) -> None:
        named = [algo for algo in CHECKSUMS if getattr(self, algo) is not None]
        if len(named) != 1:
            raise ValueError(f"a file entry needs exactly one checksum of {', '.join(CHECKSUMS)}: {named}")

    @property
    def algo(self) -> str:
        return next(algo for algo in CHECKSUMS if getattr(self, algo) is not None)

    @property
    def checksum(self) -> int:
        return getattr(self, self.algo)

    def to_dict(self) -> dict[str, int]:
        return {"size": self.size, self.algo: self.checksum}

    @classmethod
    def from_dict(cls, body: dict[str, object]) -> FileEntry:
        unknown = sorted(set(body) - {"size", *CHECKSUMS})
        if unknown:
            raise ValueError(f"unknown file entry key(s) {', '.join(unknown)} (a newer kit's checksum?)")
        return cls(**{k: int(v) for k, v in body.items()})  # type: ignore[call-overload]


@dataclass(frozen=True, kw_only=True)
class CommitRecord:
    step: int
    world_size: int
    files: dict[str, FileEntry]
    """File name (relative to the step folder) -> size and checksum; every file of the checkpoint."""
    created: float = field(default_factory=time.time)
    format: str = FORMAT
    global_batch: int | None = None
    """Samples per optimizer step of the run that wrote it (`training.global_batch`); None: not declared."""
    reshard: str | None = None
    """'' when this checkpoint may load into another world size; else why it may not (a per-rank extra);
    None in records written before resharded resume existed: they load on their own world size only."""

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files.values())

    def to_json(self) -> str:
        body = asdict(self)
        body["files"] = {k: v.to_dict() for k, v in sorted(self.files.items())}
        return json.dumps(body, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CommitRecord:
        body = json.loads(text, object_pairs_hook=_refuse_duplicate_keys)
        if body.get("format") != FORMAT:
            raise ValueError(f"unknown commit format {body.get('format')!r} (expected {FORMAT})")
        files = {name: FileEntry.from_dict(e) for name, e in body["files"].items()}
        batch = body.get("global_batch")
        if batch is not None and (type(batch) is not int or batch < 1):
            raise ValueError(f"global_batch {batch!r} is not a number of samples (a damaged record)")
        return cls(
            step=int(body["step"]),
            world_size=int(body["world_size"]),
            files=files,
            created=float(body["created"]),
            global_batch=batch,
            reshard=None if body.get("reshard") is None else str(body["reshard"]),
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


def file_checksum(path: Path, algo: str, *, meter: SharedReads | None = None) -> int:
    """The `algo` checksum (a key of CHECKSUMS) of the whole file, read once in large chunks; with a
    `meter`, every read is reported to it (a file on shared storage)."""
    update = CHECKSUMS[algo]
    value = 0
    buf = bytearray(_READ_CHUNK)
    view = memoryview(buf)
    name = os.fspath(path)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            value = update(view[:n], value)
            if meter is not None:
                meter.account(name, n)
    if meter is not None:
        meter.read_whole(name)
    return value


def verify_file(
    folder: Path, name: str, entry: FileEntry, *, checksum: bool, meter: SharedReads | None = None
) -> str | None:
    """None if the file matches its record, else a short reason; `meter` counts a shared tier's reads."""
    path = folder / name
    try:
        size = path.stat().st_size
    except OSError as exc:
        return f"{name}: missing ({exc.strerror})"
    if size != entry.size:
        return f"{name}: size {size} != recorded {entry.size}"
    if checksum:
        try:
            value = file_checksum(path, entry.algo, meter=meter)
        except OSError as exc:
            return f"{name}: unreadable ({exc.strerror})"
        if value != entry.checksum:
            return f"{name}: {entry.algo} {value:08x} != recorded {entry.checksum:08x}"
    return None
