"""EFA instance types and their network-card layouts.

The launch template needs one network interface per network card; the L2 `LaunchTemplate` cannot express
that, so the GPU node group builds the list from this table. Facts: EC2 instance-type docs and the
awsome-distributed-ai `NicLayout` table (p5/p5e 32 cards, p5en 16, p6-b200 8, p4d/p4de 4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EfaLayout = Literal["efa-only", "legacy"]
"""`efa-only`: ENA primary + EFA-only devices (1 IP per node, current EC2 guidance); `legacy`: EFA on
every card."""

InterfaceType = Literal["interface", "efa", "efa-only"]


@dataclass(frozen=True, kw_only=True, slots=True)
class InstanceSpec:
    """What the kit needs to know about one EFA-capable GPU instance type."""

    name: str
    """EC2 instance type, e.g. `p5.48xlarge`."""
    network_cards: int
    """Network cards on the instance; one EFA device per card."""
    gpus: int
    """GPUs per instance (the `nvidia.com/gpu` count the device plugin advertises)."""
    gpu_model: str
    """GPU model, for labels and docs."""
    local_nvme: bool
    """Whether the instance has local NVMe instance storage (RAID0 via nodeadm when true)."""

    @property
    def efa_devices(self) -> int:
        """EFA devices per node (the `vpc.amazonaws.com/efa` count the EFA device plugin advertises)."""
        return self.network_cards


GPU_INSTANCES: dict[str, InstanceSpec] = {
    spec.name: spec
    for spec in (
        InstanceSpec(name="p4d.24xlarge", network_cards=4, gpus=8, gpu_model="A100-40GB", local_nvme=True),
        InstanceSpec(name="p4de.24xlarge", network_cards=4, gpus=8, gpu_model="A100-80GB", local_nvme=True),
        InstanceSpec(name="p5.48xlarge", network_cards=32, gpus=8, gpu_model="H100", local_nvme=True),
        InstanceSpec(name="p5e.48xlarge", network_cards=32, gpus=8, gpu_model="H200", local_nvme=True),
        InstanceSpec(name="p5en.48xlarge", network_cards=16, gpus=8, gpu_model="H200", local_nvme=True),
        InstanceSpec(name="p6-b200.48xlarge", network_cards=8, gpus=8, gpu_model="B200", local_nvme=True),
    )
}

MAX_DEVICE_INDEX = 1
"""EC2 accepts device index 0 or 1 per network card (eksctl-io/eksctl#7520: 'device index 2 exceeds
the maximum')."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NicEntry:
    """One network interface of the launch template."""

    network_card_index: int
    device_index: int
    interface_type: InterfaceType
    primary: bool
    """The primary interface carries the cluster security group (nodes cannot join without it)."""


def nic_layout(spec: InstanceSpec, layout: EfaLayout) -> list[NicEntry]:
    """Return the launch template's interfaces for `spec` in `layout`, one EFA device per network card.

    efa-only: card 0 / device 0 is the ENA primary, card 0 / device 1 and cards 1..N-1 / device 0 are
    `efa-only` (no IP address each). legacy: card 0 / device 0 is `efa` (ENA + EFA, primary), cards
    1..N-1 / device 1 are `efa` (each takes an IP address).
    """
    if layout == "efa-only":
        entries = [
            NicEntry(network_card_index=0, device_index=0, interface_type="interface", primary=True),
            NicEntry(network_card_index=0, device_index=1, interface_type="efa-only", primary=False),
        ]
        entries += [
            NicEntry(network_card_index=card, device_index=0, interface_type="efa-only", primary=False)
            for card in range(1, spec.network_cards)
        ]
    elif layout == "legacy":
        entries = [NicEntry(network_card_index=0, device_index=0, interface_type="efa", primary=True)]
        entries += [
            NicEntry(network_card_index=card, device_index=1, interface_type="efa", primary=False)
            for card in range(1, spec.network_cards)
        ]
    else:
        raise ValueError(f"unknown EFA layout {layout!r}; use 'efa-only' or 'legacy'")
    return entries


def efa_count(entries: list[NicEntry]) -> int:
    """Number of EFA devices a layout gives (interfaces of type `efa` or `efa-only`)."""
    return sum(1 for e in entries if e.interface_type in ("efa", "efa-only"))
