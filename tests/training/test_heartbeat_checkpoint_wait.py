"""A wait on a checkpoint inside a step is announced as the "checkpoint" phase and left out of step times."""

from __future__ import annotations

import json
from pathlib import Path

from fsdpkit.runtime.heartbeat import HeartbeatClient, heartbeat_path


def _beat_file(directory: Path) -> dict:
    return json.loads(heartbeat_path(directory, 0).read_text(encoding="utf-8"))


def test_checkpoint_wait_is_the_checkpoint_phase_and_keeps_the_train_rhythm(tmp_path: Path) -> None:
    client = HeartbeatClient(directory=tmp_path, rank=0)
    client.phase("train")
    client.beat(1)
    client.beat(2)
    before = _beat_file(tmp_path)
    with client.checkpoint_wait():
        inside = _beat_file(tmp_path)
        with client.checkpoint_wait():  # nested (e.g. maybe_save waiting for the previous save): no-op
            assert _beat_file(tmp_path)["phase"] == "checkpoint"
    after = _beat_file(tmp_path)
    assert (before["phase"], inside["phase"], after["phase"]) == ("train", "checkpoint", "train")
    assert after["rhythm"] and after["step"] == 2 and after["n"] == before["n"]
    assert after["ts"] >= inside["ts"] >= before["ts"]
    client.beat(3)
    done = _beat_file(tmp_path)
    assert done["n"] == before["n"] + 1 and done["step"] == 3


def test_checkpoint_wait_in_load_returns_to_load(tmp_path: Path) -> None:
    client = HeartbeatClient(directory=tmp_path, rank=0)
    client.phase("load")
    with client.checkpoint_wait():
        assert _beat_file(tmp_path)["phase"] == "checkpoint"
    assert _beat_file(tmp_path)["phase"] == "load"
    client.close()
    with client.checkpoint_wait():  # after close: nothing is written
        pass
    assert _beat_file(tmp_path)["phase"] == "done"
