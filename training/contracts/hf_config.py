"""A Hugging Face causal LM's `config.json`, read into the kit's `ModelArgs` with the standard library only:
the trainer's config check, the memory plan and `make plan` (ops/plan) read a model's shape from it without
torch. The model itself is built by training/trainer/hf_model.py.

Layout assumed by `hf_shape` (the Llama family: Llama, Mistral, Qwen2 without biases): q, k, v, o projections
of hidden_size x heads x head_dim with head_dim = hidden_size / heads, a gated MLP of three projections, two
RMSNorms per layer. A config whose `head_dim` differs (Qwen3, Gemma) is refused by `hf_shape`: the plan would
count the attention projections wrong.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fsdpkit.contracts.shapes import ModelArgs

CONFIG = "config.json"
SIZE_FIELDS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
)
"""What `read_hf_config` requires: the architecture's name and the sizes the memory plan reads."""


class HfModelError(ValueError):
    """A model folder, its config or its weights cannot be used; the message is one line with the fix."""


def read_hf_config(folder: str | os.PathLike) -> dict[str, Any]:
    """`folder`/config.json as a dict, checked: a causal LM (`*ForCausalLM`) with every field of
    SIZE_FIELDS. Standard library only."""
    root = Path(folder)
    if not root.exists():
        raise HfModelError(f"model folder {root} does not exist: give a local folder holding config.json")
    if not root.is_dir():
        raise HfModelError(f"model folder {root} is a file: give the folder holding config.json")
    path = root / CONFIG
    if not path.is_file():
        raise HfModelError(f"{path} does not exist: a Hugging Face model folder has its config.json")
    try:
        config = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise HfModelError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise HfModelError(f"{path} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(config, dict):
        raise HfModelError(f"{path} holds a JSON {type(config).__name__}, not an object")
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        raise HfModelError(f"{path} names no architectures: the kit trains causal LMs (*ForCausalLM)")
    if not any(isinstance(a, str) and a.endswith("ForCausalLM") for a in architectures):
        raise HfModelError(
            f"{path} describes {', '.join(map(str, architectures))}, not a causal LM: the kit trains "
            f"*ForCausalLM models (next-token loss)"
        )
    missing = [name for name in SIZE_FIELDS if name not in config]
    if missing:
        raise HfModelError(f"{path} lacks {', '.join(missing)}: a causal LM's config.json gives its sizes")
    for name in SIZE_FIELDS[1:]:
        value = config[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise HfModelError(f"{path}: {name}={value!r} must be a positive integer")
    return config


def hf_shape(config: Mapping[str, Any]) -> ModelArgs:
    """The shape `fsdpkit.trainer.memory_plan` and `fsdpkit.contracts.throughput` read, from a config of
    `read_hf_config`. Standard library only. Refuses a `head_dim` other than hidden_size /
    num_attention_heads (see the module's docstring)."""
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim")
    if head_dim is not None and head_dim * heads != config["hidden_size"]:
        raise HfModelError(
            f"head_dim={head_dim} x num_attention_heads={heads} != hidden_size={config['hidden_size']}: "
            f"the memory plan counts attention as hidden_size wide; plan this model by hand"
        )
    rope = config.get("rope_parameters") or {}
    theta = config.get("rope_theta", rope.get("rope_theta", 10000.0))
    kv_heads = config.get("num_key_value_heads") or heads
    try:
        return ModelArgs(
            vocab_size=config["vocab_size"],
            dim=config["hidden_size"],
            n_layers=config["num_hidden_layers"],
            n_heads=heads,
            n_kv_heads=kv_heads,
            ffn_dim=config["intermediate_size"],
            max_seq_len=config["max_position_embeddings"],
            rope_theta=float(theta),
            norm_eps=float(config.get("rms_norm_eps", 1e-5)),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        )
    except ValueError:
        raise HfModelError(
            f"hidden_size={config['hidden_size']}, num_attention_heads={heads}, num_key_value_heads="
            f"{kv_heads}: hidden_size % heads and heads % kv_heads must be 0"
        ) from None


def check_tokenizer(tokenizer_vocab_size: int, config: Mapping[str, Any]) -> None:
    """Refuse a tokenizer whose ids reach past the model's embedding (ids >= vocab_size)."""
    vocab = config["vocab_size"]
    if tokenizer_vocab_size > vocab:
        raise HfModelError(
            f"the tokenizer has {tokenizer_vocab_size} tokens but the model's vocab_size is {vocab}: ids "
            f">= {vocab} index past the embedding; use the model's own tokenizer"
        )
