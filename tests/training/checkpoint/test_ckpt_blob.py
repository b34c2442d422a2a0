"""A rank's memory-tier copy (blob), the node tier's records and pruning, the restore plan: one process."""

from __future__ import annotations

import pytest
import torch

from fsdpkit.resilience.checkpoint.blob import (
    BlobError,
    fits,
    open_blob,
    plan_blob,
    seal_blob,
    stage_blob,
    write_blob,
)
from fsdpkit.resilience.checkpoint.commit import file_checksum
from fsdpkit.resilience.checkpoint.layout import step_dir
from fsdpkit.resilience.checkpoint.staging import HostStager, restore_into, take
from fsdpkit.resilience.checkpoint.tier import NodeTier, new_record
from fsdpkit.resilience.checkpoint.transfer import buddy_of, plan_sources


def _tree() -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "model": {"w": torch.randn(5, 3, generator=g), "b": torch.randn(3, generator=g).to(torch.bfloat16)},
        "optim": {"state": {0: {"step": torch.tensor(7.0), "m": torch.randn(4, 4, generator=g)[:, 1]}}},
        "flags": torch.tensor([True, False, True]),
        "ids": torch.arange(10, dtype=torch.int64),
        "empty": torch.empty(0, 4),
        "step": 12,
        "groups": [{"lr": 0.1, "params": [0, 1]}],
        "pair": (torch.ones(2, dtype=torch.float16), "text"),
    }


def _equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return (
            type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    return a == b


def test_a_blob_holds_every_leaf_bit_for_bit_and_its_checksum_is_the_files(tmp_path) -> None:
    tree = _tree()
    entry = write_blob(tmp_path / "b", tree)
    assert entry.size == (tmp_path / "b").stat().st_size
    assert entry.checksum == file_checksum(tmp_path / "b", "crc32c")
    blob = open_blob(tmp_path / "b")
    assert _equal(tree, blob.tree)
    blob.close()


def test_a_restore_from_a_blob_writes_into_the_live_tensors(tmp_path) -> None:
    source = {"w": torch.randn(3, 3), "n": 4}
    write_blob(tmp_path / "b", source)

    class Holder:
        def __init__(self) -> None:
            self.sd = {"w": torch.zeros(3, 3), "n": 0}

        def state_dict(self) -> dict:
            return self.sd

        def load_state_dict(self, sd: dict) -> None:
            self.sd = sd

    live = Holder()
    target = live.sd["w"]
    blob = open_blob(tmp_path / "b")
    assert fits(live.state_dict(), blob.tree) is None
    restore_into({"app": live}, {"app": blob.tree})
    blob.close()
    assert torch.equal(target, source["w"]) and live.sd["w"] is target and live.sd["n"] == 4


@pytest.mark.parametrize(
    ("live", "problem"),
    [
        ({"w": torch.zeros(3, 2), "n": 0}, "/w: local shape (3, 2) float32 live, (3, 3) float32 in the copy"),
        ({"w": torch.zeros(3, 3, dtype=torch.float64), "n": 0}, "/w: local shape (3, 3) float64 live"),
        ({"w": torch.zeros(3, 3)}, "/: keys differ (missing [], unexpected ['n'])"),
        ({"w": [torch.zeros(3, 3)], "n": 0}, "/w: a tensor in the copy, list in the live state"),
    ],
)
def test_a_copy_that_does_not_fit_the_live_state_says_where(tmp_path, live: dict, problem: str) -> None:
    write_blob(tmp_path / "b", {"w": torch.randn(3, 3), "n": 4})
    blob = open_blob(tmp_path / "b")
    assert (fits(live, blob.tree) or "").startswith(problem)
    blob.close()


@pytest.mark.parametrize("damage", ["truncated", "not a blob", "short"])
def test_a_damaged_blob_is_one_line_not_a_crash(tmp_path, damage: str) -> None:
    path = tmp_path / "b"
    write_blob(path, _tree())
    data = path.read_bytes()
    path.write_bytes(
        {"truncated": data[: len(data) - 100], "not a blob": b"X" * len(data), "short": b"K"}[damage]
    )
    with pytest.raises(BlobError, match=r"b: "):
        blob = open_blob(path)
        blob.close()


def test_the_node_tier_counts_a_copy_only_with_its_record_and_keeps_the_newest(tmp_path) -> None:
    tier = NodeTier(tmp_path)
    for step in (2, 4, 6):
        entry = write_blob(tier.pending(step, 0), {"x": torch.full((4,), float(step))})
        tier.publish(step, 0)
        assert tier.held(step) == {}  # written, not committed
        tier.commit(new_record(entry, step=step, rank=0, world_size=2, origin="own"))
        assert set(tier.held(step)) == {0}
        assert tier.verify(tier.record(step, 0), checksum=True) is None
    write_blob(tier.pending(8, 0), {"x": torch.zeros(1)})  # a save in flight
    tier.prune(keep=1, newest=6)
    assert tier.newest_steps() == [6] and tier.pending(8, 0).exists()
    record = tier.record(6, 0)
    path = tier.blob(6, 0)
    path.write_bytes(path.read_bytes()[:-1] + b"\x00")
    assert "crc32c" in tier.verify(record, checksum=True)
    assert tier.verify(record, checksum=False) is None  # same size: only the checksum can tell
    tier.record_path(6, 0).write_text("{not json")
    assert tier.held(6) == {}


def test_the_restore_plan_reads_its_own_node_first_then_spreads_the_sends() -> None:
    # 3 nodes x 2 ranks, ring buddies: rank r's copy is also on the node of rank r + 2
    world, local = 6, 2
    assert [buddy_of(r, world, local) for r in range(world)] == [2, 3, 4, 5, 0, 1]
    nodes = [{0, 1, 4, 5}, {0, 1, 4, 5}, {0, 1, 2, 3}, {0, 1, 2, 3}, {2, 3, 4, 5}, {2, 3, 4, 5}]
    assert plan_sources(nodes, world) == ({r: None for r in range(world)}, [])
    lost = [set(), set(), *nodes[2:]]  # node 0 replaced by a spare: ranks 0 and 1 hold nothing
    plan, missing = plan_sources(lost, world)
    assert missing == [] and plan == {0: 2, 1: 3, 2: None, 3: None, 4: None, 5: None}
    both = [set(), set(), set(), set(), {2, 3, 4, 5}, {2, 3, 4, 5}]  # node 0 and its buddy lost
    assert plan_sources(both, world)[1] == [0, 1]


class _Holder:
    def __init__(self, sd: dict) -> None:
        self.sd = sd

    def state_dict(self) -> dict:
        return self.sd

    def load_state_dict(self, sd: dict) -> None:
        self.sd = sd


def _stage_into_tier(tier: NodeTier, step: int, state: dict) -> tuple[dict, object]:
    """What an async save with tiers does: lay the copy out in a recycled file, stage into it, seal it."""
    taken = take(step, state)
    layout, _ = plan_blob(taken.live_tree())
    mem = tier.map_writable(tier.recycle(step, 0), layout.size)
    tree = HostStager().copy(taken, into=stage_blob(mem, layout))
    entry = seal_blob(mem, layout)
    tier.publish(step, 0)
    tier.commit(new_record(entry, step=step, rank=0, world_size=1, origin="own"))
    return tree, entry


def test_a_copy_staged_into_a_recycled_file_is_the_blob_write_blob_writes(tmp_path) -> None:
    tier = NodeTier(tmp_path / "tier")
    big = {"w": torch.randn(70_000), "m": torch.randn(33, 7)}  # one page-aligned tensor, one small
    state = {"app": _Holder({**big, "step": 3, "name": "x"})}
    _stage_into_tier(tier, 2, {"app": _Holder({"w": torch.randn(90_000), "junk": torch.randn(5)})})
    tier.prune(keep=1, newest=2)  # nothing older: step 2 stays
    _stage_into_tier(tier, 4, state)
    tier.prune(keep=1, newest=4)  # step 2's blob is now the spare that step 6 is written into
    assert tier.newest_steps() == [4] and tier.spare(0).exists()
    tree, entry = _stage_into_tier(tier, 6, state)
    assert not tier.spare(0).exists()
    write_blob(tmp_path / "ref.blob", {"app": state["app"].state_dict()})
    assert tier.blob(6, 0).read_bytes() == (tmp_path / "ref.blob").read_bytes()
    assert entry.checksum == file_checksum(tier.blob(6, 0), "crc32c")
    assert tier.verify(tier.record(6, 0), checksum=True) is None
    assert tree["app"]["w"].data_ptr() % 4096 == 0  # the shard writer sends it with O_DIRECT as it is
    big["w"].add_(1.0)  # a later update never reaches the copy
    blob = open_blob(tier.blob(6, 0))
    assert not torch.equal(blob.tree["app"]["w"], big["w"]) and torch.equal(
        tree["app"]["w"], blob.tree["app"]["w"]
    )
    blob.close()


def test_a_pruned_copy_loses_its_record_and_its_blob_is_a_spare_a_dropped_one_is_deleted(tmp_path) -> None:
    tier = NodeTier(tmp_path)
    for step in (2, 4, 6):
        _stage_into_tier(tier, step, {"app": _Holder({"x": torch.full((4,), float(step))})})
    tier.drop(6, 0)  # a dropped copy may be the stager's host copy still: never written over
    assert tier.held(6) == {} and not tier.blob(6, 0).exists() and not tier.spare(0).exists()
    tier.prune(keep=1, newest=4)
    assert tier.newest_steps() == [4] and not step_dir(tmp_path, 2).exists()
    assert [p.name for p in (tmp_path / "spare").iterdir()] == ["rank_0.blob"]
