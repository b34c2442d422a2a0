"""Per-GPU memory plan of an FSDP2 job: estimated from the shape, refused before a node is paid for.

What one rank holds at its peak (the start of backward, when every saved activation is still alive):
- model state sharded by FSDP2 over the world (or over one shard group with HSDP, `parallel.shard`): fp32
  parameters (4 B), AdamW's two moments (8 B), and the fp32 gradients (4 B) once backward reduces them: 16 B
  per parameter / the ranks it is sharded over;
- unsharded copies: the root module (embedding, final norm, output) stays gathered for the whole step
  (`reshard_after_forward=False`), a block is gathered while it runs (the next one too on GPU, where FSDP2
  prefetches on a side stream), and a block's gradients are fp32 until reduce-scatter;
- saved activations, counted tensor by tensor for `fsdpkit.trainer.model`'s own code (RMSNorm and rotary in
  fp32, SDPA saving q, k, v, out and the log-sum-exp, SwiGLU saving its three projections and their product);
  activation checkpointing keeps only each checkpointed block's input and recomputes one block in backward;
- the loss: cross-entropy keeps fp32 log-probabilities (4 B per vocabulary entry and token); its backward
  holds the incoming and outgoing gradients at once;
- a runtime reserve: on GPU the CUDA context, NCCL's buffers and allocator fragmentation (at least 4 GiB or
  5 % of the GPU; to be replaced by the GPU benchmark's figure); on CPU what torch initialises lazily on first
  use (33-35 MiB per process for both tiny and small, measured by bench.trainer).
The host side: the async checkpoint's staging buffers hold every tensor of the state (fp32 parameters and both
moments, 12 B per parameter / world size) for every rank of the node, in the node's memory; the memory tiers
(`checkpoint.tiers`) hold that share again for the kept step and for the one being written, and as much for
the buddy node's ranks with peer copies (fsdpkit.resilience.checkpoint.memory_tiers).
Standard library only, so the job CLI can show the plan without importing torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from fsdpkit.contracts.shapes import ModelArgs

if TYPE_CHECKING:
    from fsdpkit.resilience import MeshLayout

ActivationCheckpointing = Literal["none", "selective", "full"]
Tiers = Literal["off", "local", "peer"]
TIER_COPIES = {"off": 0, "local": 1, "peer": 2}
"""Node shares a memory-tier step takes: the node's own ranks' copies, and its buddy's with peer."""
GIB = 1 << 30
CPU_RUNTIME_BYTES = 40 << 20
"""Memory a CPU rank gains on first use of the model's ops, independent of the shape (bench.trainer)."""


class MemoryPlanError(ValueError):
    """The job would not fit; the message is one line with the numbers and the fix."""


def activation_bytes_per_token(shape: ModelArgs, elem: int) -> int:
    """Bytes one block saves for backward per token, with activations of `elem` bytes (2 bf16, 4 fp32).

    Each RMSNorm: its fp32 input (x itself when fp32) and normalised x (4 B each), and its output (elem);
    attention: fp32 halves of q and k for rotary, rotated q and k, v and SDPA's output (elem each; the
    output is laid out (batch, seq, heads) already, so wo's input is a view), the log-sum-exp (4 B per head);
    SwiGLU: w1 and w3 outputs, silu, product.
    """
    d, kv, f, h = shape.dim, shape.kv_dim, shape.ffn_dim, shape.n_heads
    norm = 8 * d + elem * d
    attention = 4 * (d + kv) + elem * (d + 2 * kv) + elem * d + 4 * h
    mlp = 4 * elem * f
    return 2 * norm + attention + mlp


@dataclass(frozen=True, kw_only=True)
class MemoryPlan:
    """Bytes per rank, by part; `device_total` is what must fit in one GPU (or one rank's share of host)."""

    params: int
    optimizer: int
    grads: int
    unsharded: int
    activations: int
    """Saved for backward at its start (what activation checkpointing shrinks)."""
    backward: int
    """The largest transient of backward: the loss's gradients, or one block's recompute and gradients."""
    reserve: int
    device_capacity: int
    host_staging_per_node: int
    host_tiers_per_node: int = 0
    """The memory tiers at their fullest: the kept steps and the one being written (own and buddy's)."""
    host_capacity: int
    tiers: Tiers = "off"
    ac: ActivationCheckpointing

    @property
    def device_total(self) -> int:
        step_peak = max(self.activations + self.backward + self.unsharded, self.grads + self.optimizer)
        return self.params + self.optimizer + step_peak + self.reserve

    @property
    def fits(self) -> bool:
        return self.device_total <= self.device_capacity and self.host_total <= self.host_capacity

    @property
    def host_total(self) -> int:
        """Host memory per node the checkpoint needs: staging plus the memory tiers."""
        return self.host_staging_per_node + self.host_tiers_per_node

    def line(self) -> str:
        gib = lambda n: f"{n / GIB:.1f}"  # noqa: E731
        return (
            f"memory plan: {gib(self.device_total)} of {gib(self.device_capacity)} GiB per GPU "
            f"(state {gib(self.params + self.optimizer + self.grads)}, gathered {gib(self.unsharded)}, "
            f"activations {gib(self.activations)} with activation_checkpointing={self.ac}, "
            f"backward {gib(self.backward)}, "
            f"reserve {gib(self.reserve)}); checkpoint staging {gib(self.host_staging_per_node)} + memory "
            f"tiers ({self.tiers}) {gib(self.host_tiers_per_node)} of {gib(self.host_capacity)} GiB host "
            "memory per node"
        )


def plan(
    shape: ModelArgs,
    *,
    world_size: int,
    ranks_per_node: int,
    seq_len: int,
    micro_batch: int,
    ac: ActivationCheckpointing,
    device_capacity: int,
    host_capacity: int,
    on_gpu: bool,
    staging: bool = True,
    tiers: Tiers = "off",
    tier_keep: int = 1,
    shard_group: int | None = None,
) -> MemoryPlan:
    """The plan for one rank. On GPU activations are bf16 and FSDP2 prefetches a block; on CPU all is fp32.
    `staging`: the async checkpoint's host buffers exist (checkpoint.mode=async); `tiers`, `tier_keep`: the
    memory tiers (checkpoint.tiers, tier_keep); `shard_group`: HSDP's ranks per shard group (the state is
    sharded over those only), None for FSDP over the whole world."""
    if world_size < 1 or ranks_per_node < 1 or seq_len < 1 or micro_batch < 1:
        raise MemoryPlanError(
            f"world_size={world_size}, ranks_per_node={ranks_per_node}, seq_len={seq_len}, "
            f"micro_batch={micro_batch}: each must be >= 1"
        )
    elem = 2 if on_gpu else 4
    tokens = seq_len * micro_batch
    shard = math.ceil(shape.num_params() / min(world_size, shard_group or world_size))
    per_block = activation_bytes_per_token(shape, elem) * tokens
    block_input = elem * shape.dim * tokens
    checkpointed = {"none": 0, "selective": shape.n_layers // 2, "full": shape.n_layers}[ac]
    kept = shape.n_layers - checkpointed
    final_norm = (8 * shape.dim + elem * shape.dim) * tokens
    activations = kept * per_block + checkpointed * block_input + final_norm
    # Backward starts with the loss: fp32 log-probabilities, their gradient and the logits' gradient (4 B
    # each, elem more for the cast back on GPU), and the output projection's fp32 weight gradient. Once
    # those are freed, a checkpointed block recomputes its activations beside the gradients of its MLP
    # (about three (tokens, ffn_dim) tensors at a time).
    loss = (12 + (elem if on_gpu else 0)) * shape.vocab_size * tokens + 4 * shape.vocab_size * shape.dim
    block = (per_block if checkpointed else 0) + 3 * elem * shape.ffn_dim * tokens
    backward = max(loss, block)
    prefetch = 2 if on_gpu else 1
    unsharded = elem * shape.root_params + prefetch * elem * shape.block_params + 4 * shape.block_params
    reserve = max(4 * GIB, device_capacity // 20) if on_gpu else CPU_RUNTIME_BYTES
    return MemoryPlan(
        params=4 * shard,
        optimizer=8 * shard,
        grads=4 * shard,
        unsharded=unsharded,
        activations=activations,
        backward=backward,
        reserve=reserve,
        device_capacity=device_capacity,
        host_staging_per_node=12 * shard * ranks_per_node if staging else 0,
        host_tiers_per_node=12 * shard * ranks_per_node * TIER_COPIES[tiers] * (tier_keep + 1),
        host_capacity=host_capacity,
        tiers=tiers,
        ac=ac,
    )


def refusal(shape: ModelArgs, *, nodes: int, **job) -> str | None:
    """None when the job fits; else one line with the numbers and only those fixes that do make it fit.

    `job` holds `plan`'s keywords but `world_size` (nodes x ranks_per_node). Fixes tried: stronger activation
    checkpointing, a shorter sequence (halved down to 512), a smaller micro-batch, more nodes (doubled up to
    64x).
    """
    gib = lambda n: f"{n / GIB:.1f} GiB"  # noqa: E731
    ranks = job["ranks_per_node"]

    def fits(**change) -> bool:
        args = job | change
        n = args.pop("nodes", nodes)
        return plan(shape, world_size=n * ranks, **args).fits

    p = plan(shape, world_size=nodes * ranks, **job)
    if p.fits:
        return None
    fixes = []
    order = ("none", "selective", "full")
    stronger = [m for m in order[order.index(job["ac"]) + 1 :] if fits(ac=m)]
    if stronger:
        fixes.append(f"model.activation_checkpointing={stronger[0]}")
    seq = job["seq_len"] // 2
    while seq >= 512 and not fits(seq_len=seq):
        seq //= 2
    if seq >= 512:
        fixes.append(f"data.seq_len={seq}")
    if job["micro_batch"] > 1 and fits(micro_batch=1):
        fixes.append("data.batch_size=1")
    fewer = [t for t in ("local", "off") if TIER_COPIES[t] < TIER_COPIES[job.get("tiers", "off")]]
    tiers = next((t for t in fewer if fits(tiers=t)), None)
    if tiers:
        fixes.append(f"checkpoint.tiers={tiers}")
    group = job.get("shard_group")
    if group and group < nodes * ranks:  # HSDP: a larger shard group, not more nodes, shards the state finer
        larger = next((g for g in _larger_groups(group, nodes * ranks) if fits(shard_group=g)), None)
        if larger:
            fixes.append(f"parallel.shard={larger}")
    else:
        more = next((n for n in (nodes * 2**k for k in range(1, 7)) if fits(nodes=n)), None)
        if more:
            fixes.append(f"{more} nodes")
    if p.device_total <= p.device_capacity:
        need = (
            f"checkpoint staging ({gib(p.host_staging_per_node)}) and memory tiers ({p.tiers}: "
            f"{gib(p.host_tiers_per_node)}) need {gib(p.host_total)} of host memory per node of "
            f"{gib(p.host_capacity)}"
        )
    else:
        need = (
            f"the job needs {gib(p.device_total)} per GPU of {gib(p.device_capacity)} (activations "
            f"{gib(p.activations)} with activation_checkpointing={p.ac}, backward {gib(p.backward)}, state "
            f"{gib(p.params + p.optimizer + p.grads)})"
        )
    fix = (
        ("use " + ", or ".join(fixes))
        if fixes
        else "no change of activation checkpointing, sequence length, micro-batch or node count makes it fit"
    )
    return f"{need}: {fix}"


def _larger_groups(group: int, world: int) -> list[int]:
    return [g for g in range(group + 1, world + 1) if world % g == 0 and (g % group == 0)]


def host_memory_bytes() -> int:
    """What this container may use: the smaller of the machine's memory and the cgroup's limit."""
    total = None
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
    limits = [total] if total else []
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            limits.append(int(text))
    return min(limits) if limits else 1 << 40


def planned_tiers(ckpt, *, nodes: int) -> Tiers:
    """The memory tiers a `checkpoint` config section asks for on `nodes` nodes (auto: peer with a buddy
    node, else local; off where the kit writer keeps no copy), for the plan."""
    if ckpt.mode == "off" or ckpt.tiers == "off" or (ckpt.mode == "async" and ckpt.backend != "kit"):
        return "off"
    if ckpt.tiers == "auto":
        return "peer" if nodes > 1 else "local"
    return ckpt.tiers


def _job(cfg, *, world: int, ranks_per_node: int, device_capacity: int, host_capacity: int, on_gpu: bool,
         shard_group: int | None) -> dict:  # fmt: skip
    """`plan`'s keywords (but world_size) for a trainer config: the one place that maps the config on it."""
    return {
        "ranks_per_node": ranks_per_node,
        "seq_len": cfg.data.seq_len,
        "micro_batch": cfg.data.batch_size,
        "ac": cfg.model.activation_checkpointing,
        "device_capacity": device_capacity,
        "host_capacity": host_capacity,
        "on_gpu": on_gpu,
        "staging": cfg.checkpoint.mode == "async",
        "tiers": planned_tiers(cfg.checkpoint, nodes=max(1, world // max(1, ranks_per_node))),
        "tier_keep": cfg.checkpoint.tier_keep,
        "shard_group": shard_group if shard_group and shard_group < world else None,
    }


def fits_shard_group(cfg, shape: ModelArgs, *, shard_group: int, world: int, **machine) -> bool:
    """Whether the job fits with its state sharded over `shard_group` ranks (HSDP's `parallel.shard`):
    what `parallel.replicate=auto` asks of the plan, smallest group first."""
    job = _job(cfg, world=world, shard_group=shard_group, **machine)
    return plan(shape, world_size=world, **job).fits


def plan_layout(cfg, shape: ModelArgs, *, world: int, ranks_per_node: int, **machine) -> MeshLayout:
    """The job's FSDP/HSDP layout (`parallel`): with replicate=auto and shard=auto, the smallest shard group
    that keeps nodes whole and that this plan fits. MemoryPlanError when the config's layout does not fit
    the job's shape."""

    def fits(shard: int) -> bool:
        return fits_shard_group(
            cfg, shape, shard_group=shard, world=world, ranks_per_node=ranks_per_node, **machine
        )

    try:
        return cfg.parallel.resolve(world_size=world, ranks_per_node=ranks_per_node, fits=fits)
    except ValueError as exc:  # the layout's own one line
        raise MemoryPlanError(str(exc)) from None


def plan_line(
    cfg,
    shape: ModelArgs,
    *,
    world: int,
    ranks_per_node: int,
    device_capacity: int,
    host_capacity: int,
    on_gpu: bool,
    shard_group: int | None = None,
) -> str:
    """The plan's one line for a trainer config (`fsdpkit.trainer.config.TrainConfig`), or MemoryPlanError
    with the fixes, for the trainer and for its config check. `shard_group`: HSDP's shard group size."""
    job = _job(
        cfg, world=world, ranks_per_node=ranks_per_node, device_capacity=device_capacity,
        host_capacity=host_capacity, on_gpu=on_gpu, shard_group=shard_group,
    )  # fmt: skip
    refused = refusal(shape, nodes=max(1, world // max(1, ranks_per_node)), **job)
    if refused:
        raise MemoryPlanError(refused)
    line = plan(shape, world_size=world, **job).line()
    return line if not shard_group or shard_group >= world else f"{line}; HSDP shard group {shard_group}"
