"""The trainer's typed config: one section per component, loaded once at the edge, then trusted.

Sources, strongest first: dotted CLI overrides (`--section.field VALUE` or `--section.field=VALUE`), the
YAML file given by `--config FILE`, the field defaults below. Unknown sections or fields are errors that
list the valid names; every bad value raises `ConfigError` with a one-line message (rule, value, fix).
Field docstrings are the documentation: `python -m training.train --help` prints them.
"""

from __future__ import annotations

import dataclasses
import os
import re
import textwrap
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from cliargs import parse_bool, parse_float, parse_int
from fielddocs import field_docs
from training.checkpoint.config import CheckpointConfig
from training.faults import FaultConfig, FaultConfigError


class ConfigError(ValueError):
    """A bad config value, file or option; the message is one line that says what to fix."""


_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

MAX_SECONDS = 7 * 24 * 3600.0
"""Ceiling of every duration field (`*_s`): a week."""

ModelName = Literal["tiny", "small", "llama3.1-8b"]


@dataclass(kw_only=True)
class RunConfig:
    id: str = ""
    """Run id (DNS-1123 label: lowercase letters, digits, '-', at most 63 characters); required. Names the
    run folder <root>/<id> that holds checkpoints and events."""
    root: str = "runs"
    """Folder that holds one run folder per run id (shared storage on EKS)."""
    seed: int = 0
    """Seed of model init, data order and every RNG; same seed + data + world size = same model."""

    def __post_init__(self) -> None:
        if not self.id:
            raise ConfigError("run.id is required: pass --run.id NAME (a DNS-1123 label such as 'exp-1')")
        if len(self.id) > 63 or not _DNS1123.match(self.id):
            raise ConfigError(
                f"run.id must be a DNS-1123 label (a-z, 0-9, '-', start and end alphanumeric, <= 63 chars), "
                f"got {self.id!r}: rename it, e.g. {_dns_hint(self.id)!r}"
            )
        if not self.root:
            raise ConfigError("run.root must be a folder path, got an empty string")

    @property
    def run_dir(self) -> Path:
        return Path(self.root) / self.id


def _dns_hint(name: str) -> str:
    hint = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63].strip("-")
    return hint or "run-1"


@dataclass(kw_only=True)
class ModelConfig:
    name: ModelName = "tiny"
    """Model shape: tiny (~4 M params, tests), small (~125 M, CPU benchmarks), llama3.1-8b (the study's)."""
    activation_checkpointing: Literal["none", "selective", "full"] = "none"
    """Recompute activations in backward instead of keeping them: none; selective (every second block, as
    torchtitan's per-layer mode); full (every block: only block inputs are kept). Same results, bitwise."""
    compile: bool = False
    """torch.compile each block (after activation checkpointing, before FSDP2, as torchtitan does). Off by
    default: on CPU it only adds compile time; on GPU turn it on once the job runs."""


@dataclass(kw_only=True)
class DataConfig:
    kind: Literal["synthetic", "shards"] = "synthetic"
    """Token source: a deterministic synthetic stream, or memory-mapped token shards (see make_shards)."""
    path: str = ""
    """Folder of token shards (*.bin from `python -m training.make_shards`); only for kind=shards."""
    seq_len: int = 128
    """Tokens per sample (the model sees seq_len inputs and predicts seq_len targets)."""
    batch_size: int = 4
    """Samples per rank per step (global batch = batch_size x world size)."""

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


@dataclass(kw_only=True)
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


@dataclass(kw_only=True)
class TrainingConfig:
    steps: int = 100
    """Total optimizer steps of the run (a resumed run continues up to this step)."""
    stop_at: int = 0
    """Stop cleanly after this step (final save included), as a planned interruption would; the LR schedule
    still spans training.steps, so a later run resumes as if never stopped. 0 runs to training.steps."""
    log_every: int = 10
    """Print a progress line every N steps on rank 0 (events record every step regardless)."""
    deterministic: bool = True
    """Deterministic algorithms and fixed seeds (bitwise-reproducible on CPU; a little slower on GPU)."""
    collective_timeout_s: float = 300.0
    """Timeout of every collective, in seconds; a rank stuck longer makes its peers fail (and restart)."""
    efa_devices: int = 0
    """EFA devices this node must train over (the p5 profile sets 32): before the first step, local rank 0
    checks that `fi_info -p efa` lists them and that NCCL's own log (NCCL_DEBUG=INFO, NCCL_DEBUG_FILE) shows
    aws-ofi-nccl with the EFA provider; otherwise every rank exits 78. 0 skips the check (debugging only:
    NCCL may then run over TCP sockets, about ten times slower)."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step: each rank runs forward and backward on data.batch_size samples this
    many times, then steps (global batch = batch_size x grad_accum_steps x world size)."""
    gc_every: int = 50
    """Python garbage collection on the loop's schedule: every rank collects at the same steps (young
    objects every N steps, all every 20 x N), with automatic collection off, so no rank pauses alone and
    makes its peers wait in the next collective (training/gc_schedule.py). 0 leaves Python's automatic
    collection on."""
    dump_final: str = ""
    """If set, rank 0 writes the full (unsharded) model and optimizer state at the end to this file
    (torch.save of {"step", "model", "optim"}), for comparisons; empty disables it."""

    def __post_init__(self) -> None:
        _positive("training.steps", self.steps)
        _positive("training.log_every", self.log_every)
        if not 0 <= self.stop_at <= self.steps:
            raise ConfigError(
                f"training.stop_at must be in [0, training.steps={self.steps}] (0 = no early stop), "
                f"got {self.stop_at}"
            )
        _positive("training.collective_timeout_s", self.collective_timeout_s)
        _positive("training.grad_accum_steps", self.grad_accum_steps)
        if not 0 <= self.gc_every <= _MAX_GC_EVERY:
            raise ConfigError(
                f"training.gc_every must be in [0, {_MAX_GC_EVERY}] (steps between collections; 0 = "
                f"Python's automatic collection), got {self.gc_every}"
            )
        if self.efa_devices < 0:
            raise ConfigError(
                f"training.efa_devices must be >= 0 (0 skips the EFA check), got {self.efa_devices}"
            )


@dataclass(kw_only=True)
class InprocessConfig:
    enabled: bool = False
    """Recover from a Python exception or a collective timeout inside the running processes."""
    backend: Literal["kit", "nvrx"] = "kit"
    """kit: the kit's restarter (abort group, store barrier, new group, restore from host memory or disk);
    nvrx: NVIDIA Resiliency Extension's inprocess.Wrapper (needs nvidia-resiliency-ext installed)."""
    max_restarts: int = 3
    """In-process restarts allowed per process; beyond that the rank exits and the launcher takes over."""
    barrier_timeout_s: float = 60.0
    """Seconds to wait at the restart barrier for every rank; a rank that does not arrive (dead or hung in C)
    makes the others exit non-zero so the launcher restarts the group."""

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ConfigError(f"inprocess.max_restarts must be >= 0, got {self.max_restarts}")
        _positive("inprocess.barrier_timeout_s", self.barrier_timeout_s)


@dataclass(kw_only=True)
class TrainConfig:
    """Root of the trainer's config; each component receives only its own section."""

    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    inprocess: InprocessConfig = field(default_factory=InprocessConfig)


_MAX_GC_EVERY = 100_000
"""Beyond this many steps between collections the garbage would pile up for days: not a sane setting."""


def _positive(name: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"{name} must be > 0, got {value}")


# ---------------------------------------------------------------------------------------------------------
# Introspection: sections, field types and field docstrings.


def sections() -> dict[str, type]:
    """Section name -> dataclass, in the order of TrainConfig."""
    hints = typing.get_type_hints(TrainConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(TrainConfig)}


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(str(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "none"
    return getattr(tp, "__name__", str(tp))


def _coerce(key: str, tp: Any, value: Any, *, from_cli: bool) -> Any:
    """Convert `value` (a YAML scalar, or a CLI string) to the field type `tp`; ConfigError if it cannot."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if type(None) in args and (
            value is None or (from_cli and str(value).lower() in ("none", "null", ""))
        ):
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(key, arg, value, from_cli=from_cli)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(f"{key} must be {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{key} must be one of {', '.join(map(str, choices))}; got {value!r}")
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if from_cli:
            try:
                return parse_bool(str(value), key)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if from_cli:
            try:
                return parse_int(str(value), key)
            except ValueError:
                pass
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if tp is float:
        # Every float of every section passes here, from the CLI and from YAML (`.nan`, `.inf`): nan and
        # inf are refused once, before any section's own range check can misread them.
        if isinstance(value, bool) or not (
            isinstance(value, (int, float)) or from_cli or isinstance(value, str)
        ):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        # A duration (`*_s`) also has a ceiling: timedelta and the collectives overflow long before 1e300.
        hi = MAX_SECONDS if key.endswith("_s") else None
        try:
            return parse_float(value, key, hi=hi)
        except ValueError as exc:
            hint = "; pass a number" if "not a number" in str(exc) else ""
            raise ConfigError(f"{exc}{hint}") from None
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key} must be a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported field type {tp!r}")


def valid_keys() -> list[str]:
    return [f"{name}.{f.name}" for name, cls in sections().items() for f in dataclasses.fields(cls)]


def _check_key(section: str, name: str | None) -> tuple[type, Any]:
    secs = sections()
    if section not in secs:
        raise ConfigError(f"unknown config section {section!r}; valid sections: {', '.join(secs)}")
    cls = secs[section]
    if name is None:
        return cls, None
    hints = typing.get_type_hints(cls)
    if name not in hints or name not in {f.name for f in dataclasses.fields(cls)}:
        valid = ", ".join(f"{section}.{f.name}" for f in dataclasses.fields(cls))
        raise ConfigError(f"unknown config key {section}.{name}; valid keys in {section!r}: {valid}")
    return cls, hints[name]


# ---------------------------------------------------------------------------------------------------------
# Loading.


def _read_file(path: str) -> dict[str, dict[str, Any]]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {path!r} not found: pass an existing YAML file to --config")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"config file {path!r} cannot be read as UTF-8 text ({type(exc).__name__}): fix or replace it"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise ConfigError(f"config file {path!r} is not valid YAML{at}: fix its syntax") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path!r} must be a mapping of sections, got {type(data).__name__}")
    out: dict[str, dict[str, Any]] = {}
    for section, values in data.items():
        _check_key(str(section), None)
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise ConfigError(f"section {section!r} in {path!r} must be a mapping of fields, got {values!r}")
        for name, value in values.items():
            _, tp = _check_key(str(section), str(name))
            out.setdefault(str(section), {})[str(name)] = _coerce(
                f"{section}.{name}", tp, value, from_cli=False
            )
    return out


def _parse_cli(argv: list[str]) -> tuple[str | None, dict[str, dict[str, Any]]]:
    """Split argv into (config file, {section: {field: value}}); values are converted to the field types."""
    config_file: str | None = None
    overrides: dict[str, dict[str, Any]] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg!r}: options look like --section.field VALUE")
        key, eq, value = arg[2:].partition("=")
        has_value = bool(eq)
        if not has_value and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value, has_value, i = argv[i + 1], True, i + 1
        i += 1
        if key == "config":
            if not has_value:
                raise ConfigError("--config needs a value: --config FILE.yaml")
            config_file = value
            continue
        section, dot, name = key.partition(".")
        if not dot:
            raise ConfigError(f"unknown option --{key}; options are --config FILE and --section.field VALUE")
        _, tp = _check_key(section, name)
        if not has_value:
            if tp is not bool:
                raise ConfigError(f"--{key} needs a value ({_type_name(tp)})")
            value = "true"
        overrides.setdefault(section, {})[name] = _coerce(key, tp, value, from_cli=True)
    return config_file, overrides


def load_config(argv: list[str], *, env: typing.Mapping[str, str] | None = None) -> TrainConfig:
    """Build the validated TrainConfig from argv (without the program name): CLI > file > defaults."""
    config_file, cli = _parse_cli(argv)
    merged: dict[str, dict[str, Any]] = _read_file(config_file) if config_file else {}
    for section, values in cli.items():
        merged.setdefault(section, {}).update(values)
    built: dict[str, Any] = {}
    for section, cls in sections().items():
        try:
            built[section] = cls(**merged.get(section, {}))
        except ConfigError:
            raise
        except (ValueError, TypeError) as exc:  # other modules' sections validate in __post_init__ too
            msg = " ".join(str(exc).split())
            raise ConfigError(msg if msg.startswith(f"{section}.") else f"{section}: {msg}") from None
    cfg = TrainConfig(**built)
    validate(cfg, env=os.environ if env is None else env)
    return cfg


def validate(cfg: TrainConfig, *, env: typing.Mapping[str, str]) -> None:
    """Rules across sections and against the machine (paths, installed packages)."""
    from training.shapes import MODEL_CONFIGS

    margs = MODEL_CONFIGS[cfg.model.name]
    world = env.get("WORLD_SIZE", "1")
    try:
        world_size = parse_int(world, "WORLD_SIZE", lo=1)
    except ValueError as exc:
        raise ConfigError(f"{exc}: the launcher sets it; unset it to run one process") from None
    try:  # the whole fault plan, before any process group: a bad one must fail the Job (78), not retry
        cfg.fault.plan(world_size=world_size, max_steps=cfg.training.steps)
    except FaultConfigError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.data.seq_len > margs.max_seq_len:
        raise ConfigError(
            f"data.seq_len={cfg.data.seq_len} exceeds model {cfg.model.name}'s "
            f"max_seq_len={margs.max_seq_len}: "
            f"lower data.seq_len"
        )
    if cfg.data.kind == "shards":
        from training.data import check_shards  # data owns its format; it imports torch: only when needed

        try:
            check_shards(cfg.data.path, seq_len=cfg.data.seq_len, vocab_size=margs.vocab_size)
        except (ValueError, OSError) as exc:
            raise ConfigError(str(exc)) from None
    if cfg.inprocess.enabled and cfg.inprocess.backend == "nvrx":
        try:
            import nvidia_resiliency_ext.inprocess  # noqa: F401
        except ImportError:
            raise ConfigError(
                "inprocess.backend=nvrx needs nvidia-resiliency-ext: pip install -r requirements-bench.txt, "
                "or use --inprocess.backend kit"
            ) from None
    if cfg.training.dump_final:
        parent = Path(cfg.training.dump_final).parent
        if not parent.is_dir():
            raise ConfigError(
                f"training.dump_final={cfg.training.dump_final!r}: folder {str(parent)!r} does not exist; "
                f"create it or pick another path"
            )


def help_text() -> str:
    """Every option with its type, default and docstring: what `--help` prints."""
    lines = [
        "usage: python -m training.train [--config FILE.yaml] [--section.field VALUE ...]",
        "",
        "Precedence: --section.field on the command line > the YAML file (sections as below) > defaults.",
        "Bad config exits 78 with a one-line error.",
    ]
    for section, cls in sections().items():
        lines += ["", f"{section}:"]
        hints = typing.get_type_hints(cls)
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            lines.append(f"  --{section}.{f.name} ({_type_name(hints[f.name])}, default {default!r})")
            doc = docs.get(f.name, "")
            if doc:
                lines += textwrap.wrap(doc, width=100, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines)


def to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """Plain dict (for the start event and logs)."""
    return dataclasses.asdict(cfg)
