"""NIC layouts pinned against two sources that do not come from `infra/instances.py`.

1. EC2_DOCS below, written by hand from the EC2 accelerated-computing network specifications
   (https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html) and the EFA guide's "Maximize network
   bandwidth" layouts (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html).
2. moto's copy of `ec2 describe-instance-types` (NetworkInfo: cards, per-card interface types and limits,
   EfaInfo, Ipv4AddressesPerInterface), a snapshot of the real API shipped with moto.
"""

from __future__ import annotations

import gzip
import json
import typing
from importlib import resources as importlib_resources
from typing import Any

import pytest

from fsdpkit.infra.config import GpuConfig
from fsdpkit.infra.instances import GPU_INSTANCES, MAX_DEVICE_INDEX, efa_count, max_pods, nic_layout

LAYOUTS = typing.get_args(typing.get_type_hints(GpuConfig)["efa_layout"])
CASES = [(name, layout) for name in sorted(GPU_INSTANCES) for layout in LAYOUTS]

# type: (network cards, cards with EFA, interfaces per card, GPUs)
EC2_DOCS: dict[str, tuple[int, tuple[int, ...], int, int]] = {
    "g5.48xlarge": (1, (0,), 7, 8),
    "g6e.48xlarge": (4, (0, 1, 2, 3), 10, 8),
    "p4d.24xlarge": (4, (0, 1, 2, 3), 15, 8),
    "p4de.24xlarge": (4, (0, 1, 2, 3), 15, 8),
    "p5.48xlarge": (32, tuple(range(32)), 2, 8),
    "p5e.48xlarge": (32, tuple(range(32)), 2, 8),
    "p5en.48xlarge": (16, tuple(range(16)), 4, 8),
    "p6-b200.48xlarge": (8, tuple(range(8)), 4, 8),
    "p6-b300.48xlarge": (17, tuple(range(1, 17)), 4, 8),  # card 0 is ENA only
}

# Whole layouts written out for the small types: (card, device, type), primary first.
EXPLICIT: dict[tuple[str, str], list[tuple[int, int, str]]] = {
    ("g5.48xlarge", "efa-only"): [(0, 0, "interface"), (0, 1, "efa-only")],
    ("g5.48xlarge", "legacy"): [(0, 0, "efa")],
    ("g6e.48xlarge", "efa-only"): [
        (0, 0, "interface"),
        (0, 1, "efa-only"),
        (1, 0, "efa-only"),
        (2, 0, "efa-only"),
        (3, 0, "efa-only"),
    ],
    ("g6e.48xlarge", "legacy"): [(0, 0, "efa"), (1, 1, "efa"), (2, 1, "efa"), (3, 1, "efa")],
    ("p4d.24xlarge", "legacy"): [(0, 0, "efa"), (1, 1, "efa"), (2, 1, "efa"), (3, 1, "efa")],
    ("p6-b200.48xlarge", "efa-only"): [(0, 0, "interface"), (0, 1, "efa-only")]
    + [(c, 0, "efa-only") for c in range(1, 8)],
    ("p6-b300.48xlarge", "efa-only"): [(0, 0, "interface")] + [(c, 0, "efa-only") for c in range(1, 17)],
    ("p6-b300.48xlarge", "legacy"): [(0, 0, "interface")] + [(c, 1, "efa") for c in range(1, 17)],
}


def describe_instance_types() -> dict[str, Any]:
    path = importlib_resources.files("moto.ec2") / "resources" / "instance_types.json.gz"
    with path.open("rb") as raw:
        return json.loads(gzip.decompress(raw.read()))


API = describe_instance_types()


def test_the_kit_supports_exactly_the_documented_types() -> None:
    assert set(GPU_INSTANCES) == set(EC2_DOCS)


@pytest.mark.parametrize("instance", sorted(EC2_DOCS))
def test_spec_matches_the_ec2_documentation(instance: str) -> None:
    cards, efa_cards, per_card, gpus = EC2_DOCS[instance]
    spec = GPU_INSTANCES[instance]
    assert (spec.network_cards, spec.efa_cards, spec.interfaces_per_card, spec.gpus) == (
        cards,
        efa_cards,
        per_card,
        gpus,
    )


@pytest.mark.parametrize("instance", sorted(EC2_DOCS))
def test_spec_matches_describe_instance_types(instance: str) -> None:
    info = API[instance]
    net = info["NetworkInfo"]
    spec = GPU_INSTANCES[instance]
    assert net["MaximumNetworkCards"] == spec.network_cards
    assert net["EfaInfo"]["MaximumEfaInterfaces"] == spec.efa_devices
    assert net["Ipv4AddressesPerInterface"] == spec.ipv4_per_interface
    assert info["GpuInfo"]["Gpus"][0]["Count"] == spec.gpus
    assert info["InstanceStorageSupported"] is spec.local_nvme
    card_info = {c["NetworkCardIndex"]: c for c in net["NetworkCards"]}
    assert {c["MaximumNetworkInterfaces"] for c in card_info.values()} == {spec.interfaces_per_card}
    efa_capable = tuple(i for i, c in sorted(card_info.items()) if "efa" in c.get("InterfaceTypes", ["efa"]))
    assert efa_capable == spec.efa_cards


@pytest.mark.parametrize(("instance", "layout"), CASES)
def test_layout_fits_every_card_describe_instance_types_reports(instance: str, layout: str) -> None:
    net = API[instance]["NetworkInfo"]
    cards = {c["NetworkCardIndex"]: c for c in net["NetworkCards"]}
    entries = nic_layout(GPU_INSTANCES[instance], layout)  # type: ignore[arg-type]
    for entry in entries:
        card = cards[entry.network_card_index]
        assert entry.interface_type in card.get("InterfaceTypes", ["interface", "efa", "efa-only"])
        assert entry.device_index < card["MaximumNetworkInterfaces"]
    assert efa_count(entries) == net["EfaInfo"]["MaximumEfaInterfaces"]


@pytest.mark.parametrize(("instance", "layout"), sorted(EXPLICIT))
def test_small_layouts_match_the_written_out_table(instance: str, layout: str) -> None:
    entries = nic_layout(GPU_INSTANCES[instance], layout)  # type: ignore[arg-type]
    assert [(e.network_card_index, e.device_index, e.interface_type) for e in entries] == EXPLICIT[
        (instance, layout)
    ]


@pytest.mark.parametrize(("instance", "layout"), CASES)
def test_cross_type_properties(instance: str, layout: str) -> None:
    """Exactly one ENA primary at card 0 / device 0; every card once per device index; EFA = EFA cards."""
    _cards, efa_cards, _per_card, _gpus = EC2_DOCS[instance]
    entries = nic_layout(GPU_INSTANCES[instance], layout)  # type: ignore[arg-type]
    primaries = [e for e in entries if e.primary]
    assert [(p.network_card_index, p.device_index) for p in primaries] == [(0, 0)]
    assert primaries[0] is entries[0]
    assert primaries[0].interface_type in ("interface", "efa")
    slots = [(e.network_card_index, e.device_index) for e in entries]
    assert len(slots) == len(set(slots)), "two interfaces on the same card and device index"
    assert all(0 <= e.device_index <= MAX_DEVICE_INDEX for e in entries)
    efa = [e for e in entries if e.interface_type in ("efa", "efa-only")]
    assert sorted(e.network_card_index for e in efa) == list(efa_cards)
    assert efa_count(entries) == len(efa_cards)
    if layout == "efa-only":
        assert all(e.interface_type == "efa-only" for e in entries[1:])


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


@pytest.mark.parametrize(
    ("instance", "layout", "pods"),
    [
        # card 0 holds 2 interfaces; efa-only takes one without an address: 1 x 49 + 2
        ("p5.48xlarge", "efa-only", 51),
        ("p5.48xlarge", "legacy", 100),
        ("p5en.48xlarge", "efa-only", 149),
        ("p6-b300.48xlarge", "efa-only", 198),
        ("g5.48xlarge", "efa-only", 250),  # 6 x 49 + 2 = 296, capped at EKS's 250
    ],
)
def test_max_pods_counts_only_addressable_pod_ips(instance: str, layout: str, pods: int) -> None:
    assert max_pods(GPU_INSTANCES[instance], layout) == pods  # type: ignore[arg-type]


def test_unknown_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown EFA layout 'efa-foo'"):
        nic_layout(GPU_INSTANCES["p5.48xlarge"], "efa-foo")  # type: ignore[arg-type]


# Instance types EC2 Capacity Blocks for ML offer, written by hand from the EC2 user guide
# (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-capacity-blocks.html, "Supported instance types").
CAPACITY_BLOCK_TYPES = {
    "p4d.24xlarge",
    "p4de.24xlarge",
    "p5.48xlarge",
    "p5e.48xlarge",
    "p5en.48xlarge",
    "p6-b200.48xlarge",
    "p6-b300.48xlarge",
}


def test_capacity_block_flag_matches_the_ec2_guide() -> None:
    offered = {name for name, spec in GPU_INSTANCES.items() if spec.capacity_blocks}
    assert offered == CAPACITY_BLOCK_TYPES & set(GPU_INSTANCES)
    assert not GPU_INSTANCES["g5.48xlarge"].capacity_blocks
    assert not GPU_INSTANCES["g6e.48xlarge"].capacity_blocks
