"""The kit's own Llama (fsdpkit.trainer.model) as Hugging Face's LlamaForCausalLM: names and config.

The two compute the same function, bitwise in fp32 on CPU (tests/export): RMSNorm, SwiGLU, grouped-query
attention, and rotary embeddings in the same convention: the kit's `apply_rope` rotates the pairs
(x[..., :half], x[..., half:]) with frequencies theta^(-i/half), which is HF's `rotate_half` with
theta^(-2i/head_dim). So q and k are copied as they are; Meta's original checkpoints rotate interleaved
pairs (x[2i], x[2i+1]) instead, which is why HF's convert_llama_weights_to_hf permutes them, and why this
module does not. The kit's model has no bias, no tied embedding and plain rope (no scaling); its rope tables
are computed, never saved.

Shapes come from `fsdpkit.contracts.shapes.MODEL_CONFIGS`: the shape is `--model NAME`, or the one named
shape whose tensors the checkpoint's match.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from fsdpkit.contracts.shapes import MODEL_CONFIGS, ModelArgs
from fsdpkit.export.dcp_read import StoredTensor
from fsdpkit.export.errors import ExportError, listed

MARKER = "tok_embeddings.weight"
"""A parameter only the kit's own model has: how its checkpoints are told from a Hugging Face model's."""
_ROOT = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = {
    "attention_norm.weight": "input_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
}
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")


def is_kit_checkpoint(tensors: list[StoredTensor]) -> bool:
    return any(t.name == MARKER for t in tensors)


def hf_name(name: str) -> str | None:
    """LlamaForCausalLM's name for a parameter of the kit's model; None for a name the kit's model lacks."""
    if name in _ROOT:
        return _ROOT[name]
    match = _LAYER.match(name)
    if match and match.group(2) in _BLOCK:
        return f"model.layers.{match.group(1)}.{_BLOCK[match.group(2)]}"
    return None


def hf_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Every parameter of LlamaForCausalLM of shape `args`, in the kit model's order."""
    d, hd = args.dim, args.head_dim
    block = {
        "attention_norm.weight": (d,),
        "attention.wq.weight": (args.n_heads * hd, d),
        "attention.wk.weight": (args.n_kv_heads * hd, d),
        "attention.wv.weight": (args.n_kv_heads * hd, d),
        "attention.wo.weight": (d, args.n_heads * hd),
        "ffn_norm.weight": (d,),
        "feed_forward.w1.weight": (args.ffn_dim, d),
        "feed_forward.w3.weight": (args.ffn_dim, d),
        "feed_forward.w2.weight": (d, args.ffn_dim),
    }
    shapes = {_ROOT["tok_embeddings.weight"]: (args.vocab_size, d)}
    for i in range(args.n_layers):
        shapes |= {f"model.layers.{i}.{_BLOCK[k]}": v for k, v in block.items()}
    return shapes | {_ROOT["norm.weight"]: (d,), _ROOT["output.weight"]: (args.vocab_size, d)}


def mismatches(tensors: list[StoredTensor], args: ModelArgs) -> list[str]:
    """What differs between the checkpoint's tensors and the kit's Llama of shape `args`, in model order."""
    want = hf_shapes(args)
    found, seen = [], set()
    for t in tensors:
        name = hf_name(t.name)
        if name is None or name not in want:
            found.append(f"{t.name} is in the checkpoint, not in the model")
            continue
        seen.add(name)
        if t.shape != want[name]:
            found.append(f"{t.name} is {list(t.shape)} in the checkpoint, {list(want[name])} in the shape")
    found += [f"{name} is missing from the checkpoint" for name in want if name not in seen]
    return found


@dataclass(frozen=True)
class KitShape:
    name: str
    args: ModelArgs


def resolve_shape(tensors: list[StoredTensor], model: str | None) -> KitShape:
    """The named shape of the checkpoint's kit Llama: `model`, which must match, or the one that matches."""
    if model is not None:
        if model not in MODEL_CONFIGS:
            raise ExportError(f"--model {model!r} is not a shape of the kit: {', '.join(MODEL_CONFIGS)}")
        if found := mismatches(tensors, MODEL_CONFIGS[model]):
            raise ExportError(
                f"the checkpoint does not match the kit's Llama {model} ({listed(found, 'mismatch')})"
            )
        return KitShape(model, MODEL_CONFIGS[model])
    scored = sorted((len(mismatches(tensors, args)), name) for name, args in MODEL_CONFIGS.items())
    matching = [name for score, name in scored if score == 0]
    if len(matching) == 1:
        return KitShape(matching[0], MODEL_CONFIGS[matching[0]])
    if matching:
        raise ExportError(
            f"the checkpoint matches the kit's shapes {', '.join(matching)}: pick one with --model"
        )
    nearest = scored[0][1]
    found = mismatches(tensors, MODEL_CONFIGS[nearest])
    raise ExportError(
        f"the checkpoint's kit Llama matches none of the shapes {', '.join(MODEL_CONFIGS)}; against the "
        f"nearest, {nearest}: {listed(found, 'mismatch')}"
    )


def llama_config(args: ModelArgs, dtype: str) -> dict[str, Any]:
    """LlamaForCausalLM's config.json for the kit's model of shape `args`, weights in `dtype`: the keys
    transformers 4.x and 5.x both read (`dtype` for 5.x, `torch_dtype` for 4.x)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": args.vocab_size,
        "hidden_size": args.dim,
        "intermediate_size": args.ffn_dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads,
        "head_dim": args.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": args.max_seq_len,
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": dtype,
        "torch_dtype": dtype,
    }


def plan(tensors: list[StoredTensor], model: str | None) -> tuple[KitShape, list[tuple[str, StoredTensor]]]:
    """The shape, and (LlamaForCausalLM's name, stored tensor) for every parameter, in the model's order."""
    shape = resolve_shape(tensors, model)
    return shape, [(hf_name(t.name) or t.name, t) for t in tensors]
