"""A Hugging Face causal LM as the kit's model, from a local folder (`config.json`, and `model.safetensors` or
`model.safetensors.index.json` with its shards: a copy of Llama-3.1-8B on FSx, say). Never the network.

- `read_hf_config` and `hf_shape` (training/contracts/hf_config.py) read `config.json` into the memory plan's
  and MFU's `ModelArgs`, with the standard library only;
- `check_weights` compares the safetensors headers with the model the config describes (built on the meta
  device), before any process group, so a wrong folder fails in one line and not on rank 37 at step 0;
- `build_hf_model` builds the model the way `fsdpkit.trainer.model.build_model` builds the kit's own Llama:
  activation checkpointing inside each decoder layer, `fully_shard` per decoder layer then the root, fp32
  master weights with optional FSDP2 mixed precision; then the weights are either read per shard from the
  safetensors (each rank reads only the bytes of its own shard) or initialised with HF's `_init_weights`;
- `hf_loss` is the kit's loss (`fsdpkit.trainer.model.loss_fn`) on the HF model's logits: the kit's loader
  gives (inputs, targets) already shifted by one token, so the model's own `labels=` loss, which shifts again,
  is not used.

Layout assumed by `hf_shape` (the Llama family: Llama, Mistral, Qwen2 without biases): q, k, v, o projections
of hidden_size x heads x head_dim with head_dim = hidden_size / heads, a gated MLP of three projections, two
RMSNorms per layer. A config whose `head_dim` differs (Qwen3, Gemma) is refused by `hf_shape` (the plan would
count the attention projections wrong); the model itself still builds and loads. Checkpoint keys must be the
module's parameter names (true of the Llama family; models that HF renames keys for on load are not).
Attention is pinned to SDPA, which is deterministic on CPU with `torch.use_deterministic_algorithms(True)`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsdpkit.contracts.hf_config import CONFIG, HfModelError, read_hf_config
from fsdpkit.trainer.memory_plan import ActivationCheckpointing

if TYPE_CHECKING:
    import torch
    from torch import nn

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
IGNORED_FILE_KEYS = ("rotary_emb.inv_freq",)
"""Key endings some older checkpoints carry that are buffers computed at build time, not parameters."""
SHOWN = 3
"""How many mismatches a weights error names before counting the rest."""


def has_weights(folder: str | os.PathLike) -> bool:
    """Whether `folder` holds safetensors weights (one file or an index of shards)."""
    root = Path(folder)
    return (root / INDEX_FILE).is_file() or (root / SINGLE_FILE).is_file()


def weight_shapes(folder: str | os.PathLike) -> dict[str, tuple[tuple[int, ...], Path]]:
    """name -> (shape, file) for every tensor of the folder's safetensors, from the headers alone (8-byte
    length then JSON; no tensor data is read). Standard library only."""
    root = Path(folder)
    index = root / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_bytes().decode("utf-8"))["weight_map"]
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
            raise HfModelError(f"{index} is not a safetensors index (JSON with a weight_map)") from None
        files = sorted({root / name for name in weight_map.values()})
    elif (root / SINGLE_FILE).is_file():
        weight_map, files = None, [root / SINGLE_FILE]
    else:
        raise HfModelError(f"{root} holds neither {SINGLE_FILE} nor {INDEX_FILE}")
    shapes: dict[str, tuple[tuple[int, ...], Path]] = {}
    for path in files:
        for name, shape in _header(path).items():
            shapes[name] = (shape, path)
    for name, file in (weight_map or {}).items():
        if name not in shapes or shapes[name][1] != root / file:
            raise HfModelError(f"{index} puts {name} in {file}, whose header lacks it")
    return shapes


def _header(path: Path) -> dict[str, tuple[int, ...]]:
    """The tensor shapes of one safetensors file, from its header."""
    if not path.is_file():
        raise HfModelError(f"{path} does not exist (named by {INDEX_FILE})")
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > size - 8:
                raise ValueError(f"header of {length} bytes in a file of {size}")
            header = json.loads(f.read(length).decode("utf-8"))
        return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    except (struct.error, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise HfModelError(f"{path} is not a safetensors file: {exc}") from None


def _transformers():
    """transformers, offline: these code paths never reach a model hub."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import transformers

    return transformers


def _hf_config(folder: str | os.PathLike, config: Mapping[str, Any] | None = None):
    """The transformers config object of `folder` (or of the dict `config`), errors as HfModelError."""
    transformers = _transformers()
    raw = dict(config) if config is not None else read_hf_config(folder)
    try:
        if config is not None:
            return transformers.AutoConfig.for_model(**raw)
        return transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (ValueError, KeyError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HfModelError(
            f"transformers cannot read {folder}/{CONFIG} (model_type {raw['model_type']!r}): {first}"
        ) from None


def _meta_model(hf_config) -> nn.Module:
    """The causal LM of `hf_config` on the meta device: fp32 parameters, SDPA attention, no KV cache."""
    import torch

    transformers = _transformers()
    hf_config.use_cache = False
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(
            hf_config, attn_implementation="sdpa", dtype=torch.float32
        )


def _mismatches(model: nn.Module, shapes: Mapping[str, tuple[tuple[int, ...], Path]]) -> list[str]:
    """What differs between the model's parameters and the file's tensors, in the model's order. A group
    of tied parameters (one tensor under several names) needs one of its names in the file."""
    groups: dict[int, list[tuple[str, tuple[int, ...]]]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append((name, tuple(param.shape)))
    known = {name for group in groups.values() for name, _ in group}
    found = []
    for group in groups.values():
        present = [(name, shape) for name, shape in group if name in shapes]
        if not present:
            found.append(f"{group[0][0]} is missing from the file")
        for name, shape in present:
            if shapes[name][0] != shape:
                found.append(f"{name} is {list(shapes[name][0])} in the file, {list(shape)} in the config")
    for name in shapes:
        if name not in known and not name.endswith(IGNORED_FILE_KEYS):
            found.append(f"{name} is in the file, not in the model")
    return found


def _refuse_mismatches(folder: str | os.PathLike, found: list[str]) -> None:
    if found:
        more = f"; and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
        raise HfModelError(
            f"weights in {folder} do not match {CONFIG} ({len(found)} mismatch"
            f"{'es' if len(found) > 1 else ''}): {'; '.join(found[:SHOWN])}{more}"
        )


def check_weights(folder: str | os.PathLike, config: Mapping[str, Any] | None = None) -> None:
    """Refuse, in one line, safetensors in `folder` that do not fit the model of `config` (the dict of
    `read_hf_config`; read from `folder` when None): tensors missing, unexpected or of another shape. Reads
    the headers only and builds the model on the meta device: no tensor data, no process group."""
    model = _meta_model(_hf_config(folder, config))
    _refuse_mismatches(folder, _mismatches(model, weight_shapes(folder)))


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers, in order: the modules whose class HF names in `_no_split_modules` (what must
    not be split across devices: one FSDP2 unit each), else the longest nn.ModuleList."""
    from torch import nn

    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
        layers = list(max(lists, key=len)) if lists else []
    if not layers:
        raise HfModelError(f"{type(model).__name__} has no decoder layers to shard (no _no_split_modules)")
    return layers


def _checkpoint_forward(layer: nn.Module) -> None:
    """Make `layer` keep only its inputs and recompute in backward, inside its FSDP2 unit (as
    `fsdpkit.trainer.model.Block` does): FSDP2's pre-backward hook gathers the parameters before the
    recompute."""
    import torch
    from torch.utils.checkpoint import checkpoint

    forward = layer.forward

    def checkpointed(*args, **kwargs):
        if torch.is_grad_enabled():
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return forward(*args, **kwargs)

    layer.forward = checkpointed


def _init_buffers(model: nn.Module) -> None:
    """Recompute the buffers (rotary `inv_freq`): `to_empty` leaves them as garbage, and none is in the
    file. HF's `_init_weights` is what HF itself runs for buffers of a model built on meta; it is applied
    to the modules that own buffers and no parameters, so it cannot touch a parameter."""
    for module in model.modules():
        if next(module.buffers(recurse=False), None) is not None and not list(module.parameters(False)):
            model._init_weights(module)


def _init_sharded(model: nn.Module, seed: int) -> None:
    """HF's `_init_weights` on the sharded parameters from `seed` (DTensor's RNG gives each shard its
    part of one random stream). `_init_weights` zeroes an embedding's padding row through an index, which
    on a DTensor writes into a copy: that row is zeroed here, in the shard that holds it."""
    import torch
    from torch import nn
    from torch.distributed.tensor import DTensor

    torch.manual_seed(seed)
    model.apply(model._init_weights)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                weight = module.weight
                rows = _shard_bounds(tuple(weight.shape), weight)[0]
                local = weight.to_local() if isinstance(weight, DTensor) else weight
                if rows.start <= module.padding_idx < rows.stop:
                    local[module.padding_idx - rows.start].zero_()


def _shard_bounds(shape: tuple[int, ...], param) -> tuple[slice, ...]:
    """Per-dimension bounds of this rank's piece of a DTensor parameter: Shard(d) splits like torch.chunk
    (ceil-sized pieces, the last ones short or empty), applied over the mesh's dimensions in order."""
    from torch.distributed.tensor import DTensor, Shard

    bounds = [[0, n] for n in shape]
    if not isinstance(param, DTensor):
        return tuple(slice(a, b) for a, b in bounds)
    mesh = param.device_mesh
    coordinate = mesh.get_coordinate()
    for mesh_dim, placement in enumerate(param.placements):
        if placement.is_replicate():
            continue
        if type(placement) is not Shard:
            raise HfModelError(f"cannot load a parameter placed as {placement}: FSDP2's Shard(dim) only")
        start, stop = bounds[placement.dim]
        piece = math.ceil((stop - start) / mesh.size(mesh_dim))
        begin = min(start + coordinate[mesh_dim] * piece, stop)
        bounds[placement.dim] = [begin, min(begin + piece, stop)]
    return tuple(slice(a, b) for a, b in bounds)


def _load_shards(model: nn.Module, shapes: Mapping[str, tuple[tuple[int, ...], Path]]) -> None:
    """Copy each parameter's own shard from the safetensors, reading only that slice, in the parameter's
    dtype. Tied parameters are read once, under whichever of their names the file has."""
    import torch
    from safetensors import safe_open
    from torch.distributed.tensor import DTensor

    handles: dict[Path, Any] = {}
    done: set[int] = set()
    with torch.no_grad(), contextlib.ExitStack() as files:
        for name, param in model.named_parameters(remove_duplicate=False):
            if id(param) in done or name not in shapes:
                continue
            shape, path = shapes[name]
            if path not in handles:
                handles[path] = files.enter_context(safe_open(str(path), framework="pt"))
            local = param.to_local() if isinstance(param, DTensor) else param
            bounds = _shard_bounds(shape, param)
            if any(b.stop <= b.start for b in bounds):
                piece = torch.empty([b.stop - b.start for b in bounds])
            else:
                piece = handles[path].get_slice(name)[bounds]
            if tuple(piece.shape) != tuple(local.shape):
                raise HfModelError(
                    f"{name}: this rank's piece is {list(piece.shape)}, its shard {list(local.shape)}"
                )
            local.copy_(piece.to(dtype=local.dtype))
            done.add(id(param))


def build_hf_model(
    folder: str | os.PathLike,
    *,
    mesh,
    device: torch.device,
    seed: int,
    param_dtype: torch.dtype | None = None,
    activation_checkpointing: ActivationCheckpointing = "none",
    load_weights: bool | None = None,
    init_weights: bool = True,
) -> nn.Module:
    """The causal LM of `folder`, sharded with FSDP2 over `mesh` on `device`, its values set.

    Values: `load_weights` (None: when the folder has safetensors) reads each rank's shards from the file,
    after checking the headers against the config; otherwise `seed` drives HF's `_init_weights`, on CPU on
    the full model before sharding (the same weights for any world size, as `fsdpkit.trainer.model` does),
    on GPU on each rank's shards after sharding (DTensor's RNG keeps the shards consistent).
    `init_weights=False` leaves the parameters as allocated, for a caller that restores every one from a
    checkpoint. The buffers (rotary tables) are always recomputed. Parameters are fp32; `param_dtype` (e.g.
    bf16) turns on FSDP2 mixed precision with fp32 gradient reduction. `activation_checkpointing`: none,
    every second decoder layer (selective) or all (full), as `fsdpkit.trainer.model.checkpointed_blocks`
    chooses.
    """
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from fsdpkit.trainer.model import checkpointed_blocks

    read_hf_config(folder)
    if activation_checkpointing not in ("none", "selective", "full"):
        raise HfModelError(f"activation_checkpointing={activation_checkpointing!r}: none, selective or full")
    present = has_weights(folder)
    if load_weights is None:
        if not present and any(Path(folder).glob("*.bin")):
            raise HfModelError(
                f"{folder} has .bin weights but no safetensors: convert them, or pass load_weights=False "
                f"to start from random weights"
            )
        load_weights = present and init_weights
    if load_weights and not init_weights:
        raise HfModelError(
            "load_weights=True and init_weights=False contradict each other: init_weights=False is for a "
            "caller that sets every value itself (a checkpoint restore)"
        )
    if load_weights and not present:
        raise HfModelError(f"load_weights=True but {folder} holds neither {SINGLE_FILE} nor {INDEX_FILE}")
    model = _meta_model(_hf_config(folder))
    shapes = None
    if load_weights:
        shapes = weight_shapes(folder)
        _refuse_mismatches(folder, _mismatches(model, shapes))
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else None
    kwargs = {"mesh": mesh} | ({"mp_policy": mp} if mp is not None else {})
    init_full = device.type == "cpu" and init_weights and not load_weights
    if init_full:
        model.to_empty(device=device)
        model.tie_weights()  # to_empty outside FSDP2 gives each name of a tied matrix its own tensor
        torch.manual_seed(seed)
        model.apply(model._init_weights)
    layers = decoder_layers(model)
    for layer, recompute in zip(
        layers, checkpointed_blocks(len(layers), activation_checkpointing), strict=True
    ):
        if recompute:
            _checkpoint_forward(layer)
        fully_shard(layer, **kwargs)
    fully_shard(model, reshard_after_forward=False, **kwargs)
    if not init_full:
        model.to_empty(device=device)
        _init_buffers(model)
        if load_weights:
            _load_shards(model, shapes)
        elif init_weights:
            _init_sharded(model, seed)
    return model


def hf_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The kit's loss on the HF model: mean cross-entropy of `model(input_ids=inputs)` against `targets`,
    both (batch, seq), targets already shifted (the kit's loader gives next tokens). Do not pass `labels=`
    to the model as well: it shifts them again."""
    from fsdpkit.trainer.model import loss_fn

    return loss_fn(model(input_ids=inputs, use_cache=False).logits, targets)
