"""A Hugging Face model trained through the API (a user's script, or the kit trainer's `model.hf_path`): the
checkpoint holds the module's own parameter names, so the export names are the checkpoint's, checked against
the model that `--config` (the folder the run trained from) describes.

The model is built from its config on the meta device (no memory, no weights): its state dict gives every
name and shape the checkpoint must have. Tied parameters (an input embedding that is also the output
projection) are one tensor under two names: the file gets the first name of the group the checkpoint has,
once, as `save_pretrained` writes it, and `from_pretrained` ties it again. The config.json written is the
folder's own, with the export's dtype; a generation_config.json beside it is copied.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsdpkit.contracts.hf_config import CONFIG, HfModelError, read_hf_config
from fsdpkit.export.dcp_read import StoredTensor
from fsdpkit.export.errors import ExportError, listed

IGNORED = ("rotary_emb.inv_freq",)
"""Buffers some models keep in their state dict that are computed at build time: never exported."""
GENERATION_CONFIG = "generation_config.json"


@dataclass(frozen=True)
class HfModel:
    """What `--config` describes, read before the checkpoint is: a bad folder is refused before any
    checksum is computed."""

    folder: Path
    config: dict[str, Any]
    """config.json as read (checked by fsdpkit.contracts.hf_config)."""
    groups: list[list[tuple[str, tuple[int, ...]]]]
    """The model's state dict: groups of names that share one tensor, each name with its shape."""

    @property
    def architecture(self) -> str:
        return str(self.config["architectures"][0])

    def written_config(self, dtype: str) -> dict[str, Any]:
        """config.json as the export writes it: the folder's, with the export's dtype (`dtype` for
        transformers 5.x, `torch_dtype` for 4.x)."""
        return dict(self.config) | {"dtype": dtype, "torch_dtype": dtype}

    def extra_files(self) -> list[Path]:
        """Files of the model folder copied beside the weights."""
        path = self.folder / GENERATION_CONFIG
        return [path] if path.is_file() else []

    def names(self, tensors: list[StoredTensor]) -> list[tuple[str, StoredTensor]]:
        """(name in the file, stored tensor) in the model's order; ExportError naming the first mismatches
        when the checkpoint's tensors are not this model's."""
        stored = {t.name: t for t in tensors}
        if found := mismatches(self.groups, stored):
            where = f"{self.folder}/{CONFIG}"
            raise ExportError(f"the checkpoint does not match {where} ({listed(found, 'mismatch')})")
        return [(group[0][0], next(stored[n] for n, _ in group if n in stored)) for group in self.groups]


def read_model(folder: Path) -> HfModel:
    """The model of `folder` (its config.json checked, then built on the meta device)."""
    try:
        config = read_hf_config(folder)
    except HfModelError as exc:
        raise ExportError(f"--config: {exc}") from None
    return HfModel(folder, config, expected(folder))


def _transformers() -> Any:
    os.environ["HF_HUB_OFFLINE"] = "1"  # a local folder only: never a model hub
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        import transformers
    except ImportError:
        raise ExportError("--config needs transformers: pip install 'eks-fsdp-resilience-kit[hf]'") from None
    return transformers


def expected(folder: Path) -> list[list[tuple[str, tuple[int, ...]]]]:
    """The state dict of the model `folder` describes, as groups of names that share one tensor (tied), in
    the model's order: [[(name, shape), ...], ...]. Built on the meta device: nothing is allocated."""
    import torch

    transformers = _transformers()
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # transformers raises anything for a config it cannot build: one line
        text = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ExportError(f"transformers cannot build a causal LM from {folder}/{CONFIG}: {text}") from None
    groups: dict[int, list[tuple[str, tuple[int, ...]]]] = {}
    for name, value in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(value), []).append((name, tuple(value.shape)))
    return list(groups.values())


def mismatches(
    groups: list[list[tuple[str, tuple[int, ...]]]], stored: Mapping[str, StoredTensor]
) -> list[str]:
    """What differs between the model's state dict and the checkpoint's, in the model's order. A group of
    tied names needs one of them in the checkpoint."""
    found = []
    known = {name for group in groups for name, _ in group}
    for group in groups:
        present = [(name, shape) for name, shape in group if name in stored]
        if not present:
            found.append(f"{group[0][0]} is missing from the checkpoint")
        for name, shape in present:
            if stored[name].shape != shape:
                found.append(
                    f"{name} is {list(stored[name].shape)} in the checkpoint, {list(shape)} in {CONFIG}"
                )
    found += [
        f"{name} is in the checkpoint, not in the model"
        for name in stored
        if name not in known and not name.endswith(IGNORED)
    ]
    return found
