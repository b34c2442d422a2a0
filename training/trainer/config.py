"""The trainer's typed config: one section per component, loaded once at the edge, then trusted.

Sources, strongest first: dotted CLI overrides (`--section.field VALUE` or `--section.field=VALUE`), the
YAML file given by `--config FILE`, the field defaults below. Unknown sections or fields are errors that
list the valid names; every bad value raises `ConfigError` with a one-line message (rule, value, fix).
Field docstrings are the documentation: `python -m fsdpkit.trainer --help` prints them.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from fsdpkit import resilience
from fsdpkit.contracts import defaults
from fsdpkit.resilience import ConfigError

if TYPE_CHECKING:
    from fsdpkit.contracts.shapes import ModelArgs

__all__ = [
    "ConfigError", "DataConfig", "ModelConfig", "OptimConfig", "TrainConfig", "help_text", "load_config",
    "model_shape", "to_dict",
]  # fmt: skip


def _positive(name: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"{name} must be > 0, got {value}")


ModelName = Literal["tiny", "small", "llama3.1-8b"]


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    name: ModelName = "tiny"
    """Model shape: tiny (~4 M params, tests), small (~125 M, CPU benchmarks), llama3.1-8b (the study's)."""
    activation_checkpointing: Literal["none", "selective", "full"] = "none"
    """Recompute activations in backward instead of keeping them: none; selective (every second block, as
    torchtitan's per-layer mode); full (every block: only block inputs are kept). Same results, bitwise."""
    hf_path: str = ""
    """A local Hugging Face model folder (config.json, optionally safetensors weights, e.g. a copy of
    Llama-3.1-8B on FSx): the trainer builds that causal LM instead of model.name's own Llama; its weights
    are loaded when the folder has them, else it starts from the seed. The memory plan and MFU read its
    config.json; a tokenizer.json beside it must be the one the shards were made with. Offline only."""
    compile: bool = False
    """torch.compile each block (after activation checkpointing, before FSDP2, as torchtitan does). Off by
    default: on CPU it only adds compile time; on GPU turn it on once the job runs."""


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    kind: Literal["synthetic", "shards"] = "synthetic"
    """Token source: a deterministic synthetic stream, or memory-mapped token shards (see data.path)."""
    path: str = ""
    """Folder of token shards (kit-prepare-data or kit-make-shards), or a Megatron-LM dataset prefix
    (PREFIX.bin + PREFIX.idx); only for kind=shards."""
    seq_len: int = 128
    """Tokens per sample (the model sees seq_len inputs and predicts seq_len targets)."""
    batch_size: int = defaults.MICRO_BATCH
    """Samples per rank per forward and backward (a micro-batch): the global batch is batch_size x
    training.grad_accum_steps x world size, or training.global_batch, split into micro-batches of this
    size."""

    def __post_init__(self) -> None:
        _positive("data.seq_len", self.seq_len)
        _positive("data.batch_size", self.batch_size)
        if self.kind == "shards" and not self.path:
            raise ConfigError("data.path is required for data.kind=shards: pass --data.path SHARD_FOLDER")
        if self.kind == "synthetic" and self.path:
            raise ConfigError(
                f"data.path={self.path!r} is only used with data.kind=shards: drop it or set "
                "--data.kind shards"
            )


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    lr: float = 1e-3
    """Peak learning rate of AdamW, reached at the end of warmup."""
    min_lr: float = 1e-4
    """Learning rate at the last step (cosine decay from lr to min_lr)."""
    warmup_steps: int = 10
    """Steps of linear warmup from lr/warmup_steps to lr."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay."""
    grad_clip: float = 1.0
    """Clip the global gradient L2 norm to this value; 0 disables clipping."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.95
    """AdamW beta2."""

    def __post_init__(self) -> None:
        _positive("optim.lr", self.lr)
        if not 0 <= self.min_lr <= self.lr:
            raise ConfigError(f"optim.min_lr must be in [0, optim.lr={self.lr}], got {self.min_lr}")
        if self.warmup_steps < 0:
            raise ConfigError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.weight_decay < 0:
            raise ConfigError(f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        if self.grad_clip < 0:
            raise ConfigError(f"optim.grad_clip must be >= 0 (0 disables clipping), got {self.grad_clip}")
        for name, beta in (("optim.beta1", self.beta1), ("optim.beta2", self.beta2)):
            if not 0 <= beta < 1:
                raise ConfigError(f"{name} must be in [0, 1), got {beta}")


@dataclass(frozen=True, kw_only=True)
class TrainConfig(resilience.ResilienceConfig):
    """The kit trainer's config: the resilience sections (run, training, checkpoint, fault, inprocess,
    straggler) plus its own model, data and optim, read and checked by the public loader like a user's."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)

    def validate(self, *, env: typing.Mapping[str, str]) -> None:
        """The resilience rules, then the trainer's own across sections and against the machine."""
        super().validate(env=env)
        _validate_trainer(self)


def load_config(argv: list[str], *, env: typing.Mapping[str, str] | None = None) -> TrainConfig:
    """Build the validated TrainConfig from argv (without the program name): CLI > file > defaults."""
    return resilience.load_config(argv, env=os.environ if env is None else env, root=TrainConfig)


def model_shape(cfg: TrainConfig) -> ModelArgs:
    """The model's shape: model.hf_path's config.json (the Llama family), else model.name's; ConfigError
    (one line) for a folder that is not a causal LM's. Standard library only."""
    from fsdpkit.contracts.hf_config import HfModelError, hf_shape, read_hf_config
    from fsdpkit.contracts.shapes import MODEL_CONFIGS

    if not cfg.model.hf_path:
        return MODEL_CONFIGS[cfg.model.name]
    try:
        return hf_shape(read_hf_config(cfg.model.hf_path))
    except HfModelError as exc:
        raise ConfigError(f"model.hf_path: {exc}") from None


def _validate_trainer(cfg: TrainConfig) -> None:
    """The model's shape against the data's sequence length, and the shards against the model."""
    margs = model_shape(cfg)
    name = f"model.hf_path={cfg.model.hf_path!r}" if cfg.model.hf_path else f"model {cfg.model.name}"
    if cfg.data.seq_len > margs.max_seq_len:
        raise ConfigError(
            f"data.seq_len={cfg.data.seq_len} exceeds {name}'s max_seq_len={margs.max_seq_len}: "
            f"lower data.seq_len"
        )
    if cfg.data.kind == "shards":
        try:
            resilience.TokenDataset.check(
                cfg.data.path, seq_len=cfg.data.seq_len, vocab_size=margs.vocab_size,
                tokenizer_json=_model_tokenizer(cfg), option="data.path",
            )  # fmt: skip
        except (ValueError, OSError) as exc:
            raise ConfigError(str(exc)) from None


def _model_tokenizer(cfg: TrainConfig) -> str | None:
    """The tokenizer.json beside model.hf_path's config as the `tokenizers` library writes it (the shards
    must be made with it), after checking its vocab fits the model's; None when there is none (nothing to
    compare)."""
    if not cfg.model.hf_path:
        return None
    path = Path(cfg.model.hf_path) / "tokenizer.json"
    if not path.is_file():
        return None
    from fsdpkit.contracts.hf_config import HfModelError, check_tokenizer, read_hf_config

    try:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(path))
        check_tokenizer(tokenizer.get_vocab_size(True), read_hf_config(cfg.model.hf_path))
        return tokenizer.to_str()
    except HfModelError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except Exception as exc:  # the tokenizers library's own errors: not a tokenizer.json it can read
        raise ConfigError(f"{path} is not a tokenizer.json the tokenizers library reads: {exc}") from None


def help_text() -> str:
    """Every option with its type, default and docstring: what `--help` prints."""
    return TrainConfig.help_text(
        "usage: python -m fsdpkit.trainer [--config FILE.yaml] [--section.field VALUE ...]"
    )


def to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """Plain dict (for the start event and logs)."""
    return dataclasses.asdict(cfg)
