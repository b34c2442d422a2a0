"""Memory tiers with real processes: 2 ranks, each its own "node" with its own tier folder in /dev/shm,
gloo, FSDP2. One run saves steps 2 and 4 (each rank's copy in its node's memory and on its buddy);
restarts from it, each after a different loss, must resume step 4 and end bitwise equal to a run that
never stopped:
- nothing lost (a rank fault): both ranks restore from their own node's memory, reading nothing from the
  shared checkpoint folder;
- node 1 lost: rank 1's copy comes from its buddy (node 0), rank 0 reads its own;
- a corrupted copy, a copy of an older step than the others', both nodes lost: shared storage serves,
  and rank 0 says why in one line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from ckpt_helpers import run

from fsdpkit.runtime.events import read_events

pytestmark = pytest.mark.slow
TIERS = ("--tiers", "peer")


def _resumes(run_dir: Path) -> dict[int, dict]:
    """Rank -> its last resume event."""
    out: dict[int, dict] = {}
    for e in read_events(run_dir):
        if e["kind"] == "resume" and e.get("step") is not None:
            out[e["rank"]] = e
    return out


def _final(run_dir: Path, rank: int) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / f"final_rank{rank}.pt")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, shm_root: Path) -> tuple[Path, Path, Path]:
    """(run folder after step 4, its node tier folders, the final state of an uninterrupted 6-step run)."""
    base = tmp_path_factory.mktemp("tiers")
    tiers = shm_root / "saved-tiers"
    run(base / "run", "--steps", "4", "--interval", "2", *TIERS, "--tier-root", str(tiers))
    run(base / "ref", "--steps", "6", "--interval", "2")
    return base / "run", tiers, base / "ref"


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _older_step_on_rank_1(tiers: Path) -> None:
    for node in ("node0", "node1"):  # rank 1's own copy and the one its buddy holds: only step 2 is left
        for suffix in ("json", "blob"):
            (tiers / node / "step_00000004" / f"rank_1.{suffix}").unlink()


CASES = {
    "nothing lost": (lambda t: None, {0: "memory", 1: "memory"}, None),
    "node 1 lost": (lambda t: shutil.rmtree(t / "node1"), {0: "memory", 1: "peer"}, None),
    "a corrupted copy": (
        lambda t: _flip_a_byte(t / "node0" / "step_00000004" / "rank_0.blob"),
        {0: "shared", 1: "shared"},
        "rank 0: rank_0.blob of step 4: crc32c",
    ),
    "an older copy": (
        _older_step_on_rank_1,
        {0: "shared", 1: "shared"},
        "no node in the job holds a copy of step 4 for rank(s) 1 (1 of 2",
    ),
    "both nodes lost": (
        lambda t: shutil.rmtree(t),
        {0: "shared", 1: "shared"},
        "holds a copy of step 4 for rank(s) 0, 1 (2 of 2",
    ),
}


def test_staging_into_the_tier_leaves_the_shards_on_shared_storage_byte_for_byte_as_without(
    saved: tuple[Path, Path, Path],
) -> None:
    run_dir, _, ref = saved
    writes = [e for e in read_events(run_dir) if e["kind"] == "tier" and e["phase"] == "write"]
    assert len(writes) == 4 and all(e["staged"] for e in writes)  # steps 2 and 4, two ranks
    step = Path("checkpoints") / "step_00000004"
    shards = sorted(p.name for p in (run_dir / step).glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]
    for name in shards:
        assert (run_dir / step / name).read_bytes() == (ref / step / name).read_bytes(), name


@pytest.mark.parametrize("case", list(CASES))
def test_a_restart_restores_from_memory_or_a_peer_or_says_why_not(
    tmp_path: Path, shm_dir: Path, saved: tuple[Path, Path, Path], case: str
) -> None:
    run_src, tiers_src, ref = saved
    lose, sources, why = CASES[case]
    run_dir, tiers = tmp_path / "run", shm_dir / case.replace(" ", "-")
    shutil.copytree(run_src, run_dir)
    shutil.copytree(tiers_src, tiers)
    lose(tiers)
    results = run(run_dir, "--steps", "6", "--interval", "2", *TIERS, "--tier-root", str(tiers), "--resume")
    resumes = _resumes(run_dir)
    assert {r: (e["step"], e["source"]) for r, e in resumes.items()} == {
        r: (4, s) for r, s in sources.items()
    }
    for event in resumes.values():
        if event["source"] == "shared":
            assert event["shared_bytes"] > 0
        else:
            assert event["shared_bytes"] == 0 and event["bytes"] > 0
    fallbacks = [e for e in read_events(run_dir) if e["kind"] == "tier" and e["phase"] == "fallback"]
    if why is None:
        assert not fallbacks
    else:
        assert [e["rank"] for e in fallbacks] == [0] and why in fallbacks[0]["reason"], fallbacks
        logged = [line for line in results[0][2].splitlines() if "memory tiers cannot restore step 4" in line]
        assert len(logged) == 1 and why in logged[0], results[0][2][-2000:]
    for rank in (0, 1):
        mine, theirs = _final(run_dir, rank), _final(ref, rank)
        assert mine.keys() == theirs.keys()
        assert [k for k in mine if not torch.equal(mine[k], theirs[k])] == []
    if case == "node 1 lost":  # the copy that came from the buddy is kept as node 1's own for next time
        record = json.loads((tiers / "node1" / "step_00000006" / "rank_1.json").read_text())
        assert record["origin"] == "own"
