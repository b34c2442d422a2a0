"""EFA instance types and their network-card layouts.

The launch template needs one network interface per EFA-capable network card; the L2 `LaunchTemplate` cannot
express that, so the GPU node group builds the list from this table. Sources: the EC2 user guide's
accelerated-computing network specifications
(https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html, "Network specifications"), the EFA guide
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html) and
`ec2 describe-instance-types` (NetworkInfo.NetworkCards, EfaInfo, Ipv4AddressesPerInterface). p6-b300 has 17
cards, of which card 0 is ENA only (16 EFA); tests pin every entry against an independent copy of those facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EfaLayout = Literal["efa-only", "legacy"]
"""`efa-only`: ENA primary + EFA-only devices (1 IP per node, current EC2 guidance); `legacy`: EFA on
every card."""

InterfaceType = Literal["interface", "efa", "efa-only"]

POD_IPS_PER_INTERFACE_RESERVED = 1
"""The VPC CNI keeps each interface's primary address for the node; pods get the secondary ones."""
HOST_NETWORK_PODS = 2
"""EKS's max-pods formula adds 2 for host-network pods (aws-node, kube-proxy) that need no pod IP."""
MAX_PODS_CAP = 250
"""EKS's recommended ceiling for instances with more than 30 vCPUs (max-pods-calculator.sh)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class InstanceSpec:
    """What the kit needs to know about one EFA-capable GPU instance type."""

    name: str
    """EC2 instance type, e.g. `p5.48xlarge`."""
    network_cards: int
    """Network cards on the instance."""
    ena_only_cards: tuple[int, ...] = ()
    """Cards without EFA (p6-b300: card 0); every other card gets one EFA device."""
    interfaces_per_card: int
    """Most network interfaces one card takes (EC2 NetworkCards[].MaximumNetworkInterfaces)."""
    ipv4_per_interface: int = 50
    """IPv4 addresses per interface (EC2 Ipv4AddressesPerInterface)."""
    gpus: int
    """GPUs per instance (the `nvidia.com/gpu` count the device plugin advertises)."""
    gpu_model: str
    """GPU model, for labels and docs."""
    local_nvme: bool
    """Whether the instance has local NVMe instance storage (RAID0 via nodeadm when true)."""
    capacity_blocks: bool = False
    """Whether EC2 Capacity Blocks for ML offer the type (EC2 user guide, "Capacity Blocks for ML",
    supported instance types: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-capacity-blocks.html;
    P4d, P4de, P5, P5e, P5en, P6-B200, P6-B300 yes; G5 and G6e no)."""

    @property
    def efa_cards(self) -> tuple[int, ...]:
        """Indices of the cards that carry an EFA device."""
        return tuple(c for c in range(self.network_cards) if c not in self.ena_only_cards)

    @property
    def efa_devices(self) -> int:
        """EFA devices per node (the `vpc.amazonaws.com/efa` count the EFA device plugin advertises)."""
        return len(self.efa_cards)


GPU_INSTANCES: dict[str, InstanceSpec] = {
    spec.name: spec
    for spec in (
        InstanceSpec(
            name="g5.48xlarge",
            network_cards=1,
            interfaces_per_card=7,
            gpus=8,
            gpu_model="A10G",
            local_nvme=True,
        ),
        InstanceSpec(
            name="g6e.48xlarge",
            network_cards=4,
            interfaces_per_card=10,
            gpus=8,
            gpu_model="L40S",
            local_nvme=True,
        ),
        InstanceSpec(
            name="p4d.24xlarge",
            capacity_blocks=True,
            network_cards=4,
            interfaces_per_card=15,
            gpus=8,
            gpu_model="A100-40GB",
            local_nvme=True,
        ),
        InstanceSpec(
            name="p4de.24xlarge",
            capacity_blocks=True,
            network_cards=4,
            interfaces_per_card=15,
            gpus=8,
            gpu_model="A100-80GB",
            local_nvme=True,
        ),
        InstanceSpec(
            name="p5.48xlarge",
            capacity_blocks=True,
            network_cards=32,
            interfaces_per_card=2,
            gpus=8,
            gpu_model="H100",
            local_nvme=True,
        ),
        InstanceSpec(
            name="p5e.48xlarge",
            capacity_blocks=True,
            network_cards=32,
            interfaces_per_card=2,
            gpus=8,
            gpu_model="H200",
            local_nvme=True,
        ),
        InstanceSpec(
            name="p5en.48xlarge",
            capacity_blocks=True,
            network_cards=16,
            interfaces_per_card=4,
            gpus=8,
            gpu_model="H200",
            local_nvme=True,
        ),
        InstanceSpec(
            name="p6-b200.48xlarge",
            capacity_blocks=True,
            network_cards=8,
            interfaces_per_card=4,
            gpus=8,
            gpu_model="B200",
            local_nvme=True,
        ),
        InstanceSpec(
            name="p6-b300.48xlarge",
            capacity_blocks=True,
            network_cards=17,
            ena_only_cards=(0,),
            interfaces_per_card=4,
            gpus=8,
            gpu_model="B300",
            local_nvme=True,
        ),
    )
}

MAX_DEVICE_INDEX = 1
"""The kit uses device index 0 or 1 per network card (eksctl-io/eksctl#7520: 'device index 2 exceeds
the maximum' on multi-card types)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NicEntry:
    """One network interface of the launch template."""

    network_card_index: int
    device_index: int
    interface_type: InterfaceType
    primary: bool
    """The primary interface carries the cluster security group (nodes cannot join without it)."""


def nic_layout(spec: InstanceSpec, layout: EfaLayout) -> list[NicEntry]:
    """Return the launch template's interfaces for `spec` in `layout`, one EFA device per EFA card.

    efa-only: card 0 / device 0 is the ENA primary; each EFA card gets an `efa-only` device (no IP address),
    at device 1 on card 0 (device 0 is the primary) and device 0 elsewhere. legacy: card 0 / device 0 is `efa`
    (ENA + EFA, primary) unless card 0 has no EFA (then a plain `interface`), other EFA cards get `efa` at
    device 1 (each takes an IP address).
    """
    efa_cards = spec.efa_cards
    if layout == "efa-only":
        entries = [NicEntry(network_card_index=0, device_index=0, interface_type="interface", primary=True)]
        entries += [
            NicEntry(
                network_card_index=card,
                device_index=1 if card == 0 else 0,
                interface_type="efa-only",
                primary=False,
            )
            for card in efa_cards
        ]
    elif layout == "legacy":
        entries = [
            NicEntry(
                network_card_index=0,
                device_index=0,
                interface_type="efa" if 0 in efa_cards else "interface",
                primary=True,
            )
        ]
        entries += [
            NicEntry(network_card_index=card, device_index=1, interface_type="efa", primary=False)
            for card in efa_cards
            if card != 0
        ]
    else:
        raise ValueError(f"unknown EFA layout {layout!r}; use 'efa-only' or 'legacy'")
    return entries


def efa_count(entries: list[NicEntry]) -> int:
    """Number of EFA devices a layout gives (interfaces of type `efa` or `efa-only`)."""
    return sum(1 for e in entries if e.interface_type in ("efa", "efa-only"))


def max_pods(spec: InstanceSpec, layout: EfaLayout) -> int:
    """Pods a GPU node can address with the VPC CNI, which places pod IPs on network card 0 only.

    Card 0 takes `interfaces_per_card` interfaces; the layout's own interfaces on card 0 that carry no IP
    (`efa-only`) use a slot without giving pod addresses, the rest of the slots are the primary plus the
    ENIs the CNI may attach. EKS formula: interfaces x (IPs per interface - 1) + 2
    (https://docs.aws.amazon.com/eks/latest/userguide/choosing-instance-type.html, max pods). Without this,
    nodeadm advertises pods from its table that ignores the EFA-only devices, and pods stay ContainerCreating.
    """
    card0 = [e for e in nic_layout(spec, layout) if e.network_card_index == 0]
    no_ip = sum(1 for e in card0 if e.interface_type == "efa-only")
    interfaces = spec.interfaces_per_card - no_ip
    addressable = interfaces * (spec.ipv4_per_interface - POD_IPS_PER_INTERFACE_RESERVED) + HOST_NETWORK_PODS
    return min(addressable, MAX_PODS_CAP)
