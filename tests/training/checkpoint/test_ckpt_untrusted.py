"""No code from bytes: a step folder planted in the run folder (a correct commit record, a pickle that
would create a marker file), a planted memory-tier blob and a forged message between ranks are refused in
one line, never run; the resume takes the commit before (or shared storage, for a blob).

One process, world size 1, a real model and optimizer, real files; "another run's pod" is simulated by
writing the folder exactly as one could (its CRCs are right: they prove integrity, not origin).
"""

from __future__ import annotations

import io
import logging
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import crc32c
import pytest
import torch
from ckpt_worker import WIDTH, App, local_tensors
from torch.distributed.checkpoint.stateful import Stateful

from fsdpkit.resilience.checkpoint import blob as blob_format
from fsdpkit.resilience.checkpoint.checkpointer import Checkpointer
from fsdpkit.resilience.checkpoint.comm import CheckpointComm
from fsdpkit.resilience.checkpoint.commit import (
    CommitRecord,
    FileEntry,
    read_commit,
    write_commit,
)
from fsdpkit.resilience.checkpoint.config import CheckpointConfig
from fsdpkit.resilience.checkpoint.layout import step_dir
from fsdpkit.resilience.checkpoint.resume import CheckpointError
from fsdpkit.resilience.checkpoint.tier import TIER_DIR_ENV, NodeTier, TierRecord
from fsdpkit.resilience.checkpoint.untrusted import Refused, load_metadata, read_metadata_file
from fsdpkit.resilience.checkpoint.wire import WireError, decode, encode
from fsdpkit.runtime.events import EventLog, read_events

LOGGER = "fsdpkit.resilience.checkpoint"


class Payload:
    """Unpickled, it creates `marker` (a stand-in for any code): pickled as a call of `Path.touch`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))

    def __deepcopy__(self, memo: dict[int, Any]) -> Payload:
        return self  # staging copies small leaves: never through __reduce__ (that would touch here)


def _checkpointer(run: Path, **cfg: Any) -> Checkpointer:
    return Checkpointer(
        CheckpointConfig(**{"mode": "sync", "interval": 1, **cfg}),
        run_dir=run,
        rank=0,
        world_size=1,
        events=EventLog(run, role="trainer", rank=0),
    )


def _train(run: Path, steps: int, **cfg: Any) -> App:
    app = App(seed=0, mesh=None)
    ckpt = _checkpointer(run, **cfg)
    for step in range(1, steps + 1):
        app.train_step(step, 0)
        ckpt.maybe_save(step, {"app": app})
    ckpt.close()
    return app


def _resume(run: Path, caplog: pytest.LogCaptureFixture, **cfg: Any) -> tuple[int | None, App, list[str]]:
    app = App(seed=7, mesh=None)
    ckpt = _checkpointer(run, **cfg)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        try:
            step = ckpt.load({"app": app})
        finally:
            ckpt.close()
    return step, app, [r.getMessage() for r in caplog.records]


def _recommit(folder: Path, step: int) -> None:
    """Write the commit record another run's pod would: every file's real size and CRC-32C."""
    old = read_commit(folder)
    files = {
        name: FileEntry(
            size=(folder / name).stat().st_size, crc32c=crc32c.crc32c((folder / name).read_bytes())
        )
        for name in old.files
    }
    (folder / "commit.json").unlink()
    write_commit(folder, CommitRecord(step=step, world_size=1, files=files, global_batch=None, reshard=""))


def _plant_step(run: Path, source: int, step: int) -> Path:
    """A copy of step `source` as step `step` (then changed by the caller and recommitted)."""
    root = run / "checkpoints"
    folder = step_dir(root, step)
    shutil.copytree(step_dir(root, source), folder)
    return folder


def test_a_planted_metadata_pickle_never_runs_and_the_commit_before_serves(tmp_path, caplog) -> None:
    run, marker = tmp_path / "run", tmp_path / "marker"
    trained = _train(run, steps=2)
    folder = _plant_step(run, 2, 3)
    (folder / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    _recommit(folder, 3)
    step, app, lines = _resume(run, caplog)
    assert not marker.exists()
    assert (step, app.step) == (2, 2)
    assert [k for k, v in local_tensors(trained).items() if not torch.equal(v, local_tensors(app)[k])] == []
    (skip,) = [line for line in lines if "step_00000003 skipped" in line]
    assert "damaged (" in skip and "step_00000003/.metadata: refused type pathlib.Path.touch" in skip
    resumes = [e for e in read_events(run) if e["kind"] == "resume"]
    assert (resumes[-1]["step"], resumes[-1]["fallback_from"]) == (2, 3)


class _Planted(Stateful):
    """Another run's writer: the App's state with its step replaced by a payload (a byte item)."""

    def __init__(self, app: App, marker: Path) -> None:
        self.app, self.marker = app, marker

    def state_dict(self) -> dict[str, Any]:
        return {**self.app.state_dict(), "step": Payload(self.marker)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise AssertionError("never loaded")


def test_a_planted_byte_item_never_runs_and_the_commit_before_serves(tmp_path, caplog) -> None:
    run, marker = tmp_path / "run", tmp_path / "marker"
    trained = _train(run, steps=2)
    writer = _checkpointer(run)
    writer.maybe_save(3, {"app": _Planted(App(seed=3, mesh=None), marker)})  # correct CRCs, committed
    writer.close()
    assert (step_dir(run / "checkpoints", 3) / "commit.json").is_file() and not marker.exists()
    step, app, lines = _resume(run, caplog)
    assert not marker.exists()
    assert (step, app.step) == (2, 2)
    assert [k for k, v in local_tensors(trained).items() if not torch.equal(v, local_tensors(app)[k])] == []
    (skip,) = [line for line in lines if "step_00000003 skipped" in line]
    # torch.save pickles `Path.touch` as getattr(Path, "touch") (protocol 2): the first global it refuses
    assert "step_00000003/__0_0.distcp (byte item app.step): refused type getattr" in skip


def _layers(seed: int, n: int) -> App:
    """Another model than App's three layers: `n` of them."""
    app = App(seed=seed, mesh=None)
    app.model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(n)])
    app.opt = torch.optim.AdamW(app.model.parameters(), lr=1e-2)
    return app


def test_a_step_that_does_not_fit_falls_back_and_only_none_fitting_stops(tmp_path, caplog) -> None:
    run = tmp_path / "run"
    _train(run, steps=2)
    other = _checkpointer(tmp_path / "other")
    other.maybe_save(3, {"app": _layers(1, 2)})  # another model's checkpoint, planted as step 3
    other.close()
    shutil.copytree(step_dir(tmp_path / "other" / "checkpoints", 3), step_dir(run / "checkpoints", 3))
    step, _, lines = _resume(run, caplog)
    assert step == 2
    assert any("step_00000003 skipped: does not load into this state" in line for line in lines)
    ckpt = _checkpointer(run)
    unfit = (
        r"step_00000003 verifies but does not fit this model/optimizer \(rank 0: RuntimeError: Missing key"
    )
    with pytest.raises(CheckpointError, match=unfit) as info:
        ckpt.load({"app": _layers(2, 4)})  # a model no committed step fits: one line, exit 78
    ckpt.close()
    assert "\n" not in str(info.value) and "resume with the config that wrote it" in str(info.value)


def test_the_metadata_allowlist_reads_what_the_kit_writes_and_nothing_else(tmp_path) -> None:
    _train(tmp_path, steps=1)
    folder = step_dir(tmp_path / "checkpoints", 1)
    metadata = read_metadata_file(folder / ".metadata")
    assert "app.model.0.weight" in metadata.state_dict_metadata
    for payload, refused in [
        (pickle.dumps(Payload(tmp_path / "m")), "pathlib.Path.touch"),
        (pickle.dumps(print), "builtins.print"),
        (pickle.dumps({"not": "metadata"}), "dict (not DCP metadata)"),
    ]:
        with pytest.raises(Refused, match=rf"^x: refused type {re.escape(refused)}"):
            load_metadata(io.BytesIO(payload), "x")
    assert not (tmp_path / "m").exists()


def _plant_blob(tier: NodeTier, step: int, header: bytes, origin: str) -> None:
    """Replace rank 0's copy of `step` by a blob of this header, its record rewritten to match (size, CRC):
    a blob planted in the node's memory (`own`), or a copy a forged peer sent with its own checksum
    (`peer`)."""
    path = tier.blob(step, 0)
    data = blob_format._PREFIX.pack(blob_format.MAGIC, len(header)) + header
    path.write_bytes(data)
    old = tier.record(step, 0)
    tier.record_path(step, 0).unlink()
    tier.commit(
        TierRecord(
            step=step, rank=0, world_size=1, size=len(data), crc32c=crc32c.crc32c(data), origin=old.origin
        )
    )


@pytest.mark.parametrize("origin", ["own", "peer"])
def test_a_planted_tier_blob_never_runs_and_shared_storage_serves(
    tmp_path, caplog, monkeypatch, origin: str
) -> None:
    run, marker, tier_dir = tmp_path / "run", tmp_path / "marker", tmp_path / "tier"
    monkeypatch.setenv(TIER_DIR_ENV, str(tier_dir))
    trained = _train(run, steps=2, mode="async", tiers="local")
    tier = NodeTier(tier_dir)
    assert set(tier.held(2)) == {0}
    _plant_blob(tier, 2, pickle.dumps(Payload(marker)), origin)
    step, app, lines = _resume(run, caplog, mode="async", tiers="local")
    assert not marker.exists()
    assert step == 2 and app.step == 2
    assert [k for k, v in local_tensors(trained).items() if not torch.equal(v, local_tensors(app)[k])] == []
    (line,) = [line for line in lines if "memory tiers cannot restore" in line]
    assert "step_00000002/rank_0.blob: header refused a pickle (pathlib.Path.touch" in line
    resumes = [e for e in read_events(run) if e["kind"] == "resume"]
    assert resumes[-1]["source"] == "shared"


@pytest.mark.parametrize(
    ("message", "refused"),
    [
        (pickle.dumps(Payload(Path("/nonexistent/marker"))), "refused a pickle (pathlib.Path.touch"),
        (b'{"r": "Popen", "f": {"args": "touch marker"}}', "refused record type 'Popen'"),
        (b'{"x": ["float32", [2], 0, 8]}', "refused a tensor entry outside a blob"),
        (b'{"dt": "Tensor"}', "refused dtype 'Tensor'"),
        (b"\x00\x01", "not the kit's JSON"),
    ],
)
def test_a_forged_peer_message_is_refused_in_one_line(message: bytes, refused: str) -> None:
    with pytest.raises(WireError, match=re.escape(refused)) as info:
        decode(message)
    assert "\n" not in str(info.value)


def test_every_message_the_checkpoint_sends_crosses_as_itself() -> None:
    record = CommitRecord(
        step=3, world_size=2, files={".metadata": FileEntry(size=5, crc32c=7)}, global_batch=8, reshard=""
    )
    tier = TierRecord(step=3, rank=1, world_size=2, size=9, crc32c=11, origin="peer")
    messages = [
        None, 3, [5, 4], "why", (record, None, None), ["a", "b"],
        ({1: tier}, {2, 4}), ("why", {0: None, 1: 0}, {1: tier}),
        (True, None, {"__0_0.distcp": FileEntry(size=1, crc32c=2)}),
        (float("nan"), torch.Size([2, 3]), torch.bfloat16),
    ]  # fmt: skip
    comm = CheckpointComm(rank=0, world_size=1, timeout_s=5)  # one process: still encoded and decoded
    for message in messages:
        sent = comm.broadcast_from_zero(message)
        (gathered,) = comm.gather_to_zero(message)
        for got in (sent, gathered, decode(encode(message))):
            assert repr(got) == repr(message) and type(got) is type(message)  # repr: NaN != NaN
    with pytest.raises(TypeError, match="a Payload; the kit sends and keeps only plain values"):
        comm.broadcast_from_zero({"x": Payload(Path("m"))})
