"""NIC layouts: one EFA device per network card, device index 0 or 1, exactly one primary interface."""

from __future__ import annotations

import typing

import pytest

from infra.config import GpuConfig
from infra.instances import GPU_INSTANCES, MAX_DEVICE_INDEX, efa_count, nic_layout

LAYOUTS = typing.get_args(typing.get_type_hints(GpuConfig)["efa_layout"])
CASES = [(name, layout) for name in sorted(GPU_INSTANCES) for layout in LAYOUTS]


@pytest.mark.parametrize(("instance", "layout"), CASES)
def test_one_efa_per_network_card(instance: str, layout: str) -> None:
    spec = GPU_INSTANCES[instance]
    entries = nic_layout(spec, layout)  # type: ignore[arg-type]
    efa = [e for e in entries if e.interface_type in ("efa", "efa-only")]
    assert efa_count(entries) == spec.network_cards == spec.efa_devices
    assert sorted(e.network_card_index for e in efa) == list(range(spec.network_cards))
    assert all(0 <= e.device_index <= MAX_DEVICE_INDEX for e in entries)
    slots = [(e.network_card_index, e.device_index) for e in entries]
    assert len(slots) == len(set(slots)), "two interfaces on the same card and device index"
    primaries = [e for e in entries if e.primary]
    assert [(p.network_card_index, p.device_index) for p in primaries] == [(0, 0)]


def test_p5_efa_only_layout_is_ena_primary_plus_32_efa_only() -> None:
    entries = nic_layout(GPU_INSTANCES["p5.48xlarge"], "efa-only")
    assert len(entries) == 33
    assert (entries[0].interface_type, entries[0].network_card_index, entries[0].device_index) == (
        "interface",
        0,
        0,
    )
    assert {e.interface_type for e in entries[1:]} == {"efa-only"}
    assert (entries[1].network_card_index, entries[1].device_index) == (0, 1)
    assert all(e.device_index == 0 for e in entries[2:])


def test_p5_legacy_layout_is_32_efa_with_device_index_1_beyond_card_0() -> None:
    entries = nic_layout(GPU_INSTANCES["p5.48xlarge"], "legacy")
    assert len(entries) == 32
    assert {e.interface_type for e in entries} == {"efa"}
    assert entries[0].device_index == 0
    assert all(e.device_index == 1 for e in entries[1:])


def test_table_matches_the_documented_card_counts() -> None:
    cards = {name: spec.network_cards for name, spec in GPU_INSTANCES.items()}
    assert cards == {
        "p4d.24xlarge": 4,
        "p4de.24xlarge": 4,
        "p5.48xlarge": 32,
        "p5e.48xlarge": 32,
        "p5en.48xlarge": 16,
        "p6-b200.48xlarge": 8,
    }


def test_unknown_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown EFA layout 'efa-foo'"):
        nic_layout(GPU_INSTANCES["p5.48xlarge"], "efa-foo")  # type: ignore[arg-type]
