"""A Llama-style decoder (RMSNorm, rotary position embeddings, SwiGLU MLP, grouped-query attention).

Shapes by name in `fsdpkit.contracts.shapes.MODEL_CONFIGS`. Parameters are created on the meta device and
materialised by `init_weights`, so the 8B model never exists unsharded in host memory: on CPU the full
model is materialised from the seed and then sharded (bitwise the same init for any world size); on GPU
each rank materialises its shards after `fully_shard` (DTensor's RNG keeps the shards consistent).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from fsdpkit.contracts.shapes import MODEL_CONFIGS as MODEL_CONFIGS  # re-exported for older imports
from fsdpkit.contracts.shapes import ModelArgs

ActivationCheckpointing = Literal["none", "selective", "full"]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * self.weight.float()).type_as(x)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def rope_tables(
    args: ModelArgs, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (max_seq_len, head_dim // 2), in fp32."""
    half = args.head_dim // 2
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, half, device=device, dtype=torch.float32) / half))
    angles = torch.outer(torch.arange(args.max_seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., :half], x[..., half:]) of x (batch, heads, seq, head_dim)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.type_as(x)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=self.n_kv_heads != self.n_heads
        )
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.ffn_dim, bias=False)
        self.w3 = nn.Linear(args.dim, args.ffn_dim, bias=False)
        self.w2 = nn.Linear(args.ffn_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.checkpointed = False
        """Activation checkpointing: keep only the block's input, recompute the rest in backward."""
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.checkpointed and torch.is_grad_enabled():
            # Non-reentrant checkpoint inside the FSDP2-wrapped block: FSDP2's pre-backward hook gathers the
            # block's parameters before the recompute runs, as with torchtitan's checkpoint_wrapper. No RNG
            # is used in the block, so the recompute is bitwise the forward.
            return checkpoint(self._forward, x, cos, sin, use_reentrant=False, preserve_rng_state=False)
        return self._forward(x, cos, sin)

    def _forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        cos, sin = rope_tables(args)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Llama-style init: N(0, 0.02) everywhere, output projections scaled by depth; norms at 1."""
        std = 0.02
        out_std = std / math.sqrt(2 * self.args.n_layers)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(("wo.weight", "w2.weight")):
                nn.init.trunc_normal_(param, std=out_std, a=-3 * out_std, b=3 * out_std, generator=generator)
            else:
                nn.init.trunc_normal_(param, std=std, a=-3 * std, b=3 * std, generator=generator)
        self.init_buffers()

    @torch.no_grad()
    def init_buffers(self) -> None:
        """The RoPE tables: computed, never saved (`to_empty` leaves them as garbage)."""
        device = self.rope_cos.device
        self.rope_cos, self.rope_sin = rope_tables(self.args, device=device)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h))


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def checkpointed_blocks(n_layers: int, mode: ActivationCheckpointing) -> list[bool]:
    """Which blocks recompute in backward: none, every second one (selective: torchtitan's per-layer mode
    with frequency 2, blocks 1, 3, 5, ...), or all (full)."""
    every = {"none": 0, "selective": 2, "full": 1}[mode]
    return [bool(every) and (i + 1) % every == 0 for i in range(n_layers)]


def build_model(
    args: ModelArgs,
    *,
    mesh,
    device: torch.device,
    seed: int,
    param_dtype: torch.dtype | None = None,
    activation_checkpointing: ActivationCheckpointing = "none",
    compile_blocks: bool = False,
    init_weights: bool = True,
) -> Transformer:
    """Create the model, shard it with FSDP2 (`fully_shard` per block, then the root) and initialise it.

    CPU: init the full model from `seed` first, then shard, so every world size starts from the same
    weights. GPU: shard on meta, then each rank initialises its own shards on the device (no full copy).
    `param_dtype` (e.g. bf16) turns on FSDP2 mixed precision with fp32 gradient reduction.
    Activation checkpointing, then torch.compile, then FSDP2, per block: torchtitan's order.
    `init_weights=False` leaves the parameters as allocated (uninitialised), for a caller that overwrites
    every one of them at once (an in-process restart restoring live state): the seeded init of the tiny
    model alone is ~0.2 s on the 2-core test machine.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    with torch.device("meta"):
        model = Transformer(args)
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else None
    kwargs = {"mesh": mesh} | ({"mp_policy": mp} if mp is not None else {})
    if device.type == "cpu":
        model.to_empty(device=device)
        if init_weights:
            model.init_weights(torch.Generator().manual_seed(seed))
        else:
            model.init_buffers()
    for block, recompute in zip(
        model.layers, checkpointed_blocks(args.n_layers, activation_checkpointing), strict=True
    ):
        block.checkpointed = recompute
        if compile_blocks:
            block.compile()
        fully_shard(block, **kwargs)
    fully_shard(model, reshard_after_forward=False, **kwargs)
    if device.type != "cpu":
        model.to_empty(device=device)
        if init_weights:
            torch.manual_seed(seed)
            model.init_weights()
        else:
            model.init_buffers()
    return model
