"""The job's data-parallel layout for the plan: 1-D FSDP (every parameter sharded over every GPU) or HSDP
(`replicate` R replicas x `shard` S ranks per shard group, R x S = the job's GPUs), the layout the plan
recommends, and what a layout costs a step.

A shard group lies inside a node (S = 1, 2, 4 or 8) or spans whole nodes (S = 8 x k, k nodes, k dividing the
node count); the replicas lie across nodes. The recommendation is the smallest shard group whose per-GPU
memory fits: the model state of training/trainer/memory_plan.py (fp32 weights 4 B, Adam's two moments 8 B,
fp32 gradients 4 B: 16 B per parameter / S), its gathered copies (the root module and two blocks in bf16, a
block's fp32 gradients), its runtime reserve (4 GiB or 5 % of the GPU), with ACTIVATION_SHARE of the GPU left
for activations, which the plan cannot size (it knows no sequence length, micro-batch or activation
checkpointing; the trainer's memory plan checks the real job before it starts).

A step's communication (`step_comm`), bandwidth plus latency, ring algorithms, nothing overlapped with
another collective (an upper bound on each link's share):
  shard group  every step gathers the parameters twice (forward and backward, bf16: 2 B each) and
               reduce-scatters the gradients (fp32: 4 B): 8 B per parameter, of which each rank moves
               (S - 1) / S; over NVLink when the group is inside a node (NVLINK_GBPS per GPU), else over EFA,
               where each node's links carry the ring's stream once (EFA_NODE_GBPS a node)
  replicas     (R > 1) one all-reduce of each rank's gradient shard (4 B x params / S) across the R
               replicas over EFA: 2 (R - 1) / R of it per ring, one ring per shard index through the node
  latency      FSDP2 issues those collectives per block (layers + the root): a ring of G ranks takes G - 1
               steps of NVLINK_HOP_S or EFA_HOP_S each
A step is then max(compute, communication): FSDP2 prefetches the next block's gather and reduces behind
backward, so communication hides behind compute up to the compute's length. Not modelled: gradient
accumulation (more gathers per step), NCCL's tree and PAT algorithms (logarithmic latency where they apply),
contention with the checkpoint's traffic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fsdpkit.contracts.shapes import ModelArgs
from fsdpkit.ops.plan.failures import PlanInputError

GPUS_PER_NODE = 8
STATE_BYTES_PER_PARAM = 12
"""fp32 weights + Adam's two moments: what one save writes per parameter (training/trainer/memory_plan.py)."""
DEVICE_STATE_BYTES_PER_PARAM = 16
"""What a GPU holds per sharded parameter: the saved 12 B plus the fp32 gradients (memory_plan.py)."""
DEVICE_BYTES = 81_559 * 2**20
"""An H100 80 GB (p5.48xlarge) as CUDA reports it: 81,559 MiB."""
ACTIVATION_SHARE = 0.25
"""The GPU's share left for activations when the plan recommends a shard group (an assumption: the plan
knows no sequence length, micro-batch or activation checkpointing)."""
NVLINK_GBPS = 450.0
"""One H100's NVLink 4 bandwidth each way, GB/s (900 GB/s both ways)."""
EFA_NODE_GBPS = 400.0
"""A p5.48xlarge's EFA, GB/s: 32 EFA x 100 Gbps = 3,200 Gbps."""
NVLINK_HOP_S = 2e-6
EFA_HOP_S = 5e-6
"""Seconds per ring step inside a node and across nodes (assumed: the order of NCCL's own cost model,
src/graph/tuning.cc)."""
GIB = 1 << 30


@dataclass(frozen=True, kw_only=True)
class Layout:
    """R replicas x S ranks per shard group on `nodes` nodes of GPUS_PER_NODE."""

    nodes: int
    replicate: int
    shard: int

    def __post_init__(self) -> None:
        world = self.nodes * GPUS_PER_NODE
        if self.replicate * self.shard != world or self.shard not in shard_sizes(self.nodes):
            raise PlanInputError(
                f"layout {self.replicate} x {self.shard} on {self.nodes} node(s): replicate x shard must be "
                f"{world} with shard one of {_sizes_text(self.nodes)}"
            )

    @property
    def world(self) -> int:
        return self.nodes * GPUS_PER_NODE

    @property
    def hsdp(self) -> bool:
        return self.replicate > 1

    @property
    def label(self) -> str:
        if not self.hsdp:
            return f"1-D FSDP over {self.world:,} GPUs"
        where = "inside a node" if self.shard <= GPUS_PER_NODE else f"{self.shard // GPUS_PER_NODE} nodes"
        return f"HSDP {self.replicate:,} x {self.shard} (shard group {where})"

    @property
    def holders(self) -> int:
        """Other nodes that hold a live copy of a lost node's shards: every other node when a shard group
        lies inside a node, else one node per other replica."""
        if self.shard <= GPUS_PER_NODE:
            return self.nodes - 1 if self.hsdp else 0
        return self.replicate - 1

    def node_state_gb(self, params: int) -> float:
        """The training state a node holds, GB (12 B per parameter / S per rank x its ranks): what a lost
        node's replacement must receive."""
        return STATE_BYTES_PER_PARAM * params / self.shard * GPUS_PER_NODE / 1e9


def shard_sizes(nodes: int) -> list[int]:
    """The shard-group sizes `nodes` nodes allow, smallest first: inside a node, or whole nodes dividing
    the node count."""
    return [1, 2, 4, 8] + [GPUS_PER_NODE * k for k in range(2, nodes + 1) if nodes % k == 0]


def _sizes_text(nodes: int) -> str:
    sizes = shard_sizes(nodes)
    return ", ".join(map(str, sizes)) if len(sizes) <= 12 else f"{', '.join(map(str, sizes[:10]))}, ..."


def device_bytes(shape: ModelArgs, shard: int) -> int:
    """One GPU's memory but the activations with shard groups of `shard` ranks (see the module docstring)."""
    state = DEVICE_STATE_BYTES_PER_PARAM * math.ceil(shape.num_params() / shard)
    gathered = 2 * shape.root_params + 2 * 2 * shape.block_params + 4 * shape.block_params
    reserve = max(4 * GIB, DEVICE_BYTES // 20)
    return state + gathered + reserve


def fits(shape: ModelArgs, shard: int) -> bool:
    return device_bytes(shape, shard) <= (1.0 - ACTIVATION_SHARE) * DEVICE_BYTES


def recommend(shape: ModelArgs, nodes: int) -> Layout:
    """The smallest shard group that fits (the most replicas); 1-D FSDP where none does."""
    shard = next((s for s in shard_sizes(nodes) if fits(shape, s)), nodes * GPUS_PER_NODE)
    return Layout(nodes=nodes, replicate=nodes * GPUS_PER_NODE // shard, shard=shard)


def parse_replicate(text: str) -> int | str:
    """`--replicate`'s value: `auto` or a whole number >= 1 (a one-line error otherwise)."""
    if text == "auto":
        return text
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise PlanInputError(
        f"--replicate {text!r}: give auto (the smallest shard group that fits) or a whole number of "
        "replicas >= 1 (1: 1-D FSDP)"
    )


def choose(shape: ModelArgs, nodes: int, replicate: int | str) -> tuple[Layout, str]:
    """The layout asked for (`auto`: the recommendation) and one line on where it comes from."""
    if replicate == "auto":
        layout = recommend(shape, nodes)
        if not fits(shape, layout.shard):
            return layout, "auto: no shard group fits the state in 75 % of a GPU; 1-D FSDP"
        return layout, "auto: the smallest shard group whose per-GPU memory fits (docs/plan.md)"
    world = nodes * GPUS_PER_NODE
    if (
        not isinstance(replicate, int)
        or replicate < 1
        or world % replicate
        or world // replicate not in shard_sizes(nodes)
    ):
        raise PlanInputError(
            f"--replicate {replicate}: give a divisor of the job's {world:,} GPUs whose shard group (GPUs / "
            f"replicas) is one of {_sizes_text(nodes)}, or auto"
        )
    layout = Layout(nodes=nodes, replicate=replicate, shard=world // replicate)
    note = "given (--replicate)"
    if not fits(shape, layout.shard):
        need = device_bytes(shape, layout.shard) / GIB
        note += f"; {need:.0f} GiB a GPU before activations: larger than the plan's fit"
    return layout, note


@dataclass(frozen=True, kw_only=True)
class StepComm:
    """Seconds a step spends on each link (see the module docstring)."""

    nvlink_s: float
    efa_s: float
    latency_s: float

    @property
    def total_s(self) -> float:
        return self.nvlink_s + self.efa_s + self.latency_s


def step_comm(layout: Layout, shape: ModelArgs) -> StepComm:
    params, units = shape.num_params(), shape.n_layers + 1
    s, r = layout.shard, layout.replicate
    group = (s - 1) / s * 8.0 * params  # two bf16 gathers and one fp32 reduce-scatter
    nvlink = efa = latency = 0.0
    if s <= GPUS_PER_NODE:
        nvlink += group / (NVLINK_GBPS * 1e9)
        latency += units * 3 * (s - 1) * NVLINK_HOP_S
    else:
        efa += group / (EFA_NODE_GBPS * 1e9)
        latency += units * 3 * (s - 1) * EFA_HOP_S
    if r > 1:
        ring = 2.0 * (r - 1) / r * 4.0 * params / s  # each rank's fp32 gradient shard, all-reduced
        if layout.nodes > 1:
            efa += min(s, GPUS_PER_NODE) * ring / (EFA_NODE_GBPS * 1e9)
            latency += units * 2 * (r - 1) * EFA_HOP_S
        else:
            nvlink += ring / (NVLINK_GBPS * 1e9)
            latency += units * 2 * (r - 1) * NVLINK_HOP_S
    return StepComm(nvlink_s=nvlink, efa_s=efa, latency_s=latency)
