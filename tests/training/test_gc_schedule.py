"""The train loop's garbage collection: automatic collection off, young and full ones at fixed steps."""

from __future__ import annotations

import gc

import pytest

from fsdpkit.resilience.config import ConfigError, TrainingConfig
from fsdpkit.resilience.gc_schedule import FULL_EVERY, GcSchedule


@pytest.fixture
def collections():
    """The generation of every collection that runs while the test does (Python's own gc callbacks)."""
    seen: list[int] = []

    def record(phase: str, info: dict) -> None:
        if phase == "start":
            seen.append(info["generation"])

    was_enabled = gc.isenabled()
    gc.callbacks.append(record)
    yield seen
    gc.callbacks.remove(record)
    (gc.enable if was_enabled else gc.disable)()


def test_collections_run_at_the_scheduled_steps_only(collections: list[int]) -> None:
    schedule = GcSchedule(every=3)
    assert not gc.isenabled(), "no automatic collection while the loop collects"
    garbage = [[] for _ in range(10_000)]  # enough allocations to trigger an automatic collection
    for item in garbage:
        item.append(item)  # cycles only a collection frees
    del garbage
    for step in (1, 2, 4, 5):
        schedule.after_step(step)
    assert collections == [], "nothing between the scheduled steps"
    schedule.after_step(3)
    schedule.after_step(3 * FULL_EVERY)
    assert collections == [1, 2], "a young collection every 3 steps, a full one every 3 x FULL_EVERY"
    schedule.close()
    assert gc.isenabled()


def test_zero_leaves_automatic_collection_alone(collections: list[int]) -> None:
    gc.enable()
    schedule = GcSchedule(every=0)
    schedule.after_step(50)
    assert gc.isenabled() and collections == []
    schedule.close()
    assert gc.isenabled()


def test_a_negative_interval_is_a_one_line_error() -> None:
    with pytest.raises(ConfigError, match=r"training\.gc_every must be in \[0, 100000\] .* got -1"):
        TrainingConfig(gc_every=-1)
