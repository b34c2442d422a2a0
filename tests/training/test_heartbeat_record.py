"""The heartbeat record is rewritten in place (no temp file, no rename), and a read that catches a write half
done is refused, so the launcher keeps what it knew instead of taking a mix of two beats."""

from __future__ import annotations

import os
import time
from pathlib import Path

from fsdpkit.launcher.monitor import HeartbeatMonitor, HeartbeatSettings
from fsdpkit.runtime.heartbeat import RECORD_BYTES, HeartbeatClient, heartbeat_path, read_record


def test_each_beat_rewrites_one_file_in_place(tmp_path: Path) -> None:
    client = HeartbeatClient(directory=tmp_path, rank=0)
    path = heartbeat_path(tmp_path, 0)
    inode = path.stat().st_ino
    seqs = []
    for step in range(1, 6):
        client.beat(step)
        record = read_record(tmp_path, 0)
        assert record is not None and record["step"] == step and record["phase"] == "train"
        seqs.append(record["seq"])
    client.interruptible(True)  # "true" is shorter than "false": the padding covers the old tail
    assert read_record(tmp_path, 0)["interruptible"] is True  # type: ignore[index]
    assert seqs == sorted(set(seqs)) and path.stat().st_ino == inode  # the same file, never replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank_0.json"]  # no temp file beside it
    assert path.stat().st_size >= RECORD_BYTES
    client.close()
    assert read_record(tmp_path, 0)["phase"] == "done"  # type: ignore[index]


def test_a_read_that_catches_a_write_half_done_is_refused(tmp_path: Path) -> None:
    settings = HeartbeatSettings(timeout_s=None, load_timeout_s=60.0, safety_factor=1.5, min_timeout_s=0.5)
    monitor = HeartbeatMonitor(tmp_path, settings)

    def phase() -> str:  # what the launcher believes after one poll
        (seen,) = monitor.silent(time.time())
        return seen.phase

    directory = monitor.reset([0])
    client = HeartbeatClient(directory=directory, rank=0)
    client.beat(1)
    path = heartbeat_path(directory, 0)
    old = path.read_bytes()
    assert phase() == "train"
    client.phase("checkpoint")
    new = path.read_bytes()
    cut = new.index(b'"pid"')
    assert cut == old.index(b'"pid"')  # the same layout: the mix below is valid JSON
    path.write_bytes(new[:cut] + old[cut:])  # the new beat's start, the old one's rest
    assert read_record(directory, 0) is None
    assert phase() == "train"  # what it knew, not a mix
    path.write_bytes(new)
    assert phase() == "checkpoint"
    os.truncate(path, 0)  # nothing written yet
    assert read_record(directory, 0) is None and phase() == "checkpoint"
