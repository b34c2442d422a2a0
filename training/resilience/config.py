"""The resilience layer's typed config: the sections every training script shares with the kit's trainer.

`run` (id, folder, seed), `training` (steps, timeouts, GC, determinism), `parallel` (FSDP or HSDP),
`checkpoint`, `fault`, `inprocess` and `straggler`. The kit's trainer adds its own sections (model, data,
optim: fsdpkit.trainer.config) to the same loader; a user's script loads only these (`load_config`), from
the Job's config file (`$KIT_CONFIG`, rendered by `make train-job`) or `--config FILE`, with
`--section.field VALUE` overrides, strongest first. Unknown sections or fields are errors that list the
valid names; every bad value raises `ConfigError` with a one-line message (rule, value, fix). Field
docstrings are the documentation.

A script adds typed sections of its own by subclassing `ResilienceConfig` (each section a frozen dataclass
whose fields have defaults and docstrings) and loading with `load_config(argv, root=MyConfig)`: its sections
are read from the same file, overridden with `--section.field VALUE` and documented by `--help` exactly as
the kit's; its `validate` (override it, call super's) checks rules across sections once, at load. A loaded
config is frozen: what changes it later (the batch plan) returns a new one.
"""

from __future__ import annotations

import dataclasses
import os
import re
import textwrap
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from fsdpkit.contracts import env
from fsdpkit.contracts.cliargs import parse_bool, parse_float, parse_int
from fsdpkit.contracts.fielddocs import field_docs
from fsdpkit.contracts.metrics_settings import MetricsSettings, MetricsSettingsError
from fsdpkit.resilience.checkpoint.config import CheckpointConfig
from fsdpkit.resilience.faults import FaultConfig, FaultConfigError
from fsdpkit.resilience.parallel import LayoutError, ParallelConfig, layout_from_env
from fsdpkit.resilience.straggler import StragglerConfig

CONFIG_ENV = env.CONFIG
RANK_RESTART_ENV = env.RANK_RESTART


class ConfigError(ValueError):
    """A bad config value, file or option; the message is one line that says what to fix."""


_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

MAX_SECONDS = 7 * 24 * 3600.0
"""Ceiling of every duration field (`*_s`): a week."""


@dataclass(frozen=True, kw_only=True)
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


@dataclass(frozen=True, kw_only=True)
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
    many times, then steps (global batch = batch_size x grad_accum_steps x world size). With
    training.global_batch set, derived from it instead (leave this at 1)."""
    global_batch: int = 0
    """Samples per optimizer step over all ranks, kept when the world size changes (a restart on another
    number of nodes, an elastic shrink or grow): each rank then runs global_batch / (world size x
    data.batch_size) micro-batches per step, and a world size that does not divide it exactly is refused
    (one line listing the sizes that do). 0: the global batch the newest checkpoint declares (a run keeps
    its batch through every restart, on any world size: set this to change it), else batch_size x
    grad_accum_steps x world size."""
    gc_every: int = 50
    """Python garbage collection on the loop's schedule: every rank collects at the same steps (young
    objects every N steps, all every 20 x N), with automatic collection off, so no rank pauses alone and
    makes its peers wait in the next collective (training/resilience/gc_schedule.py). 0 leaves Python's
    automatic collection on."""
    dump_final: str = ""
    """If set, rank 0 writes the full (unsharded) model and optimizer state at the end to this file
    (torch.save of {"step", "model", "optim"}), for comparisons; empty disables it."""

    def __post_init__(self) -> None:
        check_positive("training.steps", self.steps)
        check_positive("training.log_every", self.log_every)
        if not 0 <= self.stop_at <= self.steps:
            raise ConfigError(
                f"training.stop_at must be in [0, training.steps={self.steps}] (0 = no early stop), "
                f"got {self.stop_at}"
            )
        check_positive("training.collective_timeout_s", self.collective_timeout_s)
        check_positive("training.grad_accum_steps", self.grad_accum_steps)
        if not 0 <= self.global_batch <= _MAX_GLOBAL_BATCH:
            raise ConfigError(
                f"training.global_batch must be in [0, {_MAX_GLOBAL_BATCH}] (samples per optimizer step; 0 = "
                f"the newest checkpoint's, else batch_size x grad_accum_steps x world size), got "
                f"{self.global_batch}"
            )
        if not 0 <= self.gc_every <= _MAX_GC_EVERY:
            raise ConfigError(
                f"training.gc_every must be in [0, {_MAX_GC_EVERY}] (steps between collections; 0 = "
                f"Python's automatic collection), got {self.gc_every}"
            )
        if self.efa_devices < 0:
            raise ConfigError(
                f"training.efa_devices must be >= 0 (0 skips the EFA check), got {self.efa_devices}"
            )


@dataclass(frozen=True, kw_only=True)
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
        check_positive("inprocess.barrier_timeout_s", self.barrier_timeout_s)


_MAX_GLOBAL_BATCH = 2**31
"""More samples per optimizer step than any run has used (Llama 3 405B: 16M tokens = 2,048 x 8K)."""
_MAX_GC_EVERY = 100_000
"""Beyond this many steps between collections the garbage would pile up for days: not a sane setting."""


def check_positive(name: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"{name} must be > 0, got {value}")


# ---------------------------------------------------------------------------------------------------------
# Introspection: sections, field types and field docstrings.


def sections(root: type) -> dict[str, type]:
    """Section name -> dataclass, in the order of the root config's fields."""
    hints = typing.get_type_hints(root)
    return {f.name: hints[f.name] for f in dataclasses.fields(root)}


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


def valid_keys(root: type) -> list[str]:
    return [f"{name}.{f.name}" for name, cls in sections(root).items() for f in dataclasses.fields(cls)]


def _check_key(root: type, section: str, name: str | None) -> tuple[type, Any]:
    secs = sections(root)
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


def _read_file(root: type, path: str) -> dict[str, dict[str, Any]]:
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
        _check_key(root, str(section), None)
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise ConfigError(f"section {section!r} in {path!r} must be a mapping of fields, got {values!r}")
        for name, value in values.items():
            _, tp = _check_key(root, str(section), str(name))
            out.setdefault(str(section), {})[str(name)] = _coerce(
                f"{section}.{name}", tp, value, from_cli=False
            )
    return out


def _parse_cli(root: type, argv: list[str]) -> tuple[str | None, dict[str, dict[str, Any]]]:
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
        _, tp = _check_key(root, section, name)
        if not has_value:
            if tp is not bool:
                raise ConfigError(f"--{key} needs a value ({_type_name(tp)})")
            value = "true"
        overrides.setdefault(section, {})[name] = _coerce(key, tp, value, from_cli=True)
    return config_file, overrides


Root = TypeVar("Root", bound="ResilienceConfig")


@dataclass(frozen=True, kw_only=True)
class ResilienceConfig:
    """Root of what the resilience layer reads; each component receives only its own section. Subclass it to
    add sections of your own (see the module docstring)."""

    run: RunConfig = field(default_factory=RunConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    inprocess: InprocessConfig = field(default_factory=InprocessConfig)
    straggler: StragglerConfig = field(default_factory=StragglerConfig)

    def validate(self, *, env: Mapping[str, str]) -> None:
        """Rules across sections and against the machine (the fault plan, installed packages, paths), once at
        load and before any process group, so a bad value fails the Job (78) instead of a retry. A subclass
        adds its own rules after calling this."""
        validate(self, env=env)

    @classmethod
    def sections(cls) -> dict[str, type]:
        """Section name -> dataclass, in field order."""
        return sections(cls)

    @classmethod
    def valid_keys(cls) -> list[str]:
        """Every `section.field` this config reads."""
        return valid_keys(cls)

    @classmethod
    def help_text(cls, usage: str) -> str:
        """Every option with its type, default and docstring, under `usage`: what `--help` prints."""
        return help_text(cls, usage)


def _check_root(root: type) -> None:
    """A root is ResilienceConfig or a subclass whose every section is a dataclass with defaults."""
    if not (isinstance(root, type) and issubclass(root, ResilienceConfig)):
        raise TypeError(f"root={root!r}: load a ResilienceConfig or a dataclass subclass of it")
    for name, cls in sections(root).items():
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{root.__name__}.{name} is {cls!r}: each section is a dataclass")
        missing = [f.name for f in dataclasses.fields(cls) if _default_of(f) is dataclasses.MISSING]
        if missing:
            raise TypeError(f"{root.__name__}.{name}: fields {', '.join(missing)} need defaults")


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def build_config(root: type[Root], argv: list[str], *, env: Mapping[str, str] | None = None) -> Root:
    """`root`'s sections from argv (`--config FILE`, `--section.field VALUE`), CLI > file > defaults.

    Without --config, the file named by `$KIT_CONFIG` (when set in `env`) is read. Each section validates
    itself (`__post_init__`); rules across sections are `root.validate`'s."""
    env = os.environ if env is None else env
    _check_root(root)
    config_file, cli = _parse_cli(root, argv)
    if config_file is None and env.get(CONFIG_ENV):
        config_file = env[CONFIG_ENV]
    merged: dict[str, dict[str, Any]] = _read_file(root, config_file) if config_file else {}
    for section, values in cli.items():
        merged.setdefault(section, {}).update(values)
    built: dict[str, Any] = {}
    for section, cls in sections(root).items():
        try:
            built[section] = cls(**merged.get(section, {}))
        except ConfigError:
            raise
        except (ValueError, TypeError) as exc:  # other modules' sections validate in __post_init__ too
            msg = " ".join(str(exc).split())
            raise ConfigError(msg if msg.startswith(f"{section}.") else f"{section}: {msg}") from None
    return root(**built)


def world_size_from(env: Mapping[str, str]) -> int:
    try:
        return parse_int(env.get("WORLD_SIZE", "1"), "WORLD_SIZE", lo=1)
    except ValueError as exc:
        raise ConfigError(f"{exc}: the launcher sets it; unset it to run one process") from None


def validate(cfg: ResilienceConfig, *, env: Mapping[str, str]) -> None:
    """The resilience sections' rules across sections (`ResilienceConfig.validate`)."""
    world_size = world_size_from(env)
    training = cfg.training
    if training.global_batch and training.grad_accum_steps != 1:
        raise ConfigError(
            f"training.global_batch={training.global_batch} and training.grad_accum_steps="
            f"{training.grad_accum_steps} are both set: set one (with global_batch the accumulation is "
            "derived from the world size)"
        )
    try:
        layout_from_env(cfg.parallel, env)
    except (LayoutError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    try:
        MetricsSettings.from_env(env, run_id=cfg.run.id)
    except MetricsSettingsError as exc:
        raise ConfigError(str(exc)) from None
    try:
        cfg.fault.plan(world_size=world_size, max_steps=training.steps)
    except FaultConfigError as exc:
        raise ConfigError(str(exc)) from None
    in_place = env.get(RANK_RESTART_ENV) == "in-place"
    if in_place and not (cfg.inprocess.enabled and cfg.inprocess.backend == "kit"):
        raise ConfigError(
            "the launcher's --rank-restart in-place needs --inprocess.enabled true with --inprocess.backend "
            "kit (a worker started again rejoins its peers' in-process restart); set them, or drop the flag"
        )
    if cfg.inprocess.enabled and cfg.inprocess.backend == "nvrx":
        try:
            import nvidia_resiliency_ext.inprocess  # noqa: F401
        except ImportError:
            raise ConfigError(
                "inprocess.backend=nvrx needs nvidia-resiliency-ext: pip install -r requirements-bench.txt, "
                "or use --inprocess.backend kit"
            ) from None
    if training.dump_final:
        parent = Path(training.dump_final).parent
        if not parent.is_dir():
            raise ConfigError(
                f"training.dump_final={training.dump_final!r}: folder {str(parent)!r} does not exist; "
                f"create it or pick another path"
            )


def load_config(
    argv: list[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    root: type[Root] = ResilienceConfig,  # type: ignore[assignment]
) -> Root:
    """The validated, frozen config of type `root` (ResilienceConfig or your subclass of it): `--config
    FILE` or `$KIT_CONFIG`, then `--section.field VALUE` overrides from `argv` (a script passes what its
    own parser left over: `parse_known_args`), then `root.validate`."""
    env = os.environ if env is None else env
    cfg = build_config(root, list(argv or []), env=env)
    cfg.validate(env=env)
    return cfg


def help_text(root: type, usage: str) -> str:
    """Every option of `root` with its type, default and docstring: what `--help` prints."""
    lines = [
        usage,
        "",
        "Precedence: --section.field on the command line > the YAML file (sections as below) > defaults.",
        "Bad config exits 78 with a one-line error.",
    ]
    for section, cls in sections(root).items():
        lines += ["", f"{section}:"]
        hints = typing.get_type_hints(cls)
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            lines.append(f"  --{section}.{f.name} ({_type_name(hints[f.name])}, default {_default_of(f)!r})")
            doc = docs.get(f.name, "")
            if doc:
                lines += textwrap.wrap(doc, width=100, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines)
