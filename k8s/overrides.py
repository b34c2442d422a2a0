"""KEY=VALUE overrides to field values: each value parsed by its field's type, each key given once.

Keys are the field names, case-insensitive (`NODES=4`, `model=llama3.1-8b`, `checkpoint-mode=sync`), plus
three maps: `ENV.<NAME>=<value>` (container env), `NODE_SELECTOR.<label>=<value>`, and
`TRAIN.<section>.<field>=<value>` (trainer config fields without a field of their own, e.g.
`TRAIN.optim.lr=1e-4`). Booleans and numbers go through the shared strict parser (`cliargs`): `DRY_RUN=y`
or `NODES=1e3` is an error, never a default. A key given twice (`NODES=4 NODES=5`, or `--nodes 4 NODES=5`)
is an error too: nobody can tell which one the user meant.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

from fsdpkit.contracts.cliargs import parse_bool, parse_float, parse_int
from fsdpkit.k8s.model import TRAINER_FIELDS, JobValues, ValuesError

MAP_FIELDS: Mapping[str, str] = types.MappingProxyType(
    {"env": "ENV", "node_selector": "NODE_SELECTOR", "train": "TRAIN"}
)
"""Map field -> the key prefix users write (`ENV.NCCL_DEBUG=INFO`)."""

NUMBER_MAX = 2**31 - 1
"""Largest count or number of seconds a value may hold: Kubernetes stores them as int32."""
SEED_MAX = 2**63 - 1
"""Seeds go to the trainer's RNGs, not to Kubernetes: any signed 64-bit number."""
_SEEDS = frozenset({"seed", "fault_schedule_seed"})

# (section, field) of the trainer config -> the JobValues field that sets it (run.root/id are the kit's).
TYPED_TRAINER_FIELDS: Mapping[tuple[str, str], str] = types.MappingProxyType(
    {
        ("run", "id"): "run_id",
        ("run", "root"): "run_id",
        ("run", "seed"): "seed",
        ("model", "name"): "model",
        ("data", "kind"): "data_kind",
        ("data", "path"): "data_path",
        ("data", "seq_len"): "seq_len",
        ("data", "batch_size"): "batch_size",
        ("training", "steps"): "steps",
        ("training", "log_every"): "log_every",
        ("training", "deterministic"): "deterministic",
        ("checkpoint", "mode"): "checkpoint_mode",
        ("checkpoint", "interval"): "checkpoint_interval",
        ("checkpoint", "keep"): "checkpoint_keep",
        ("checkpoint", "backend"): "checkpoint_backend",
        ("checkpoint", "tiers"): "checkpoint_tiers",
        ("fault", "spec"): "fault_spec",
        ("fault", "schedule_seed"): "fault_schedule_seed",
        ("fault", "schedule_count"): "fault_schedule_count",
        ("fault", "schedule_kinds"): "fault_schedule_kinds",
        ("fault", "schedule_after_step"): "fault_schedule_after_step",
        ("inprocess", "enabled"): "inprocess",
        ("inprocess", "backend"): "inprocess_backend",
        ("inprocess", "max_restarts"): "inprocess_max_restarts",
        ("inprocess", "barrier_timeout_s"): "inprocess_barrier_timeout_s",
        ("straggler", "policy"): "straggler_policy",
    }
)


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(JobValues)]


@functools.cache
def _hints() -> dict[str, Any]:
    return typing.get_type_hints(JobValues)


def key_label(name: str) -> str:
    """How a field is written on the command line."""
    return name.upper()


def _strict(parse, *args, **kwargs):
    try:
        return parse(*args, **kwargs)
    except ValueError as exc:
        raise ValuesError(str(exc)) from None


def parse_scalar(name: str, raw: str) -> Any:
    """Parse `raw` for field `name` by its type; ValuesError names the key and the expected form."""
    hint = _hints()[name]
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    members = typing.get_args(hint) if union else (hint,)
    args = [a for a in members if a is not type(None)]
    if len(args) < len(members) and raw.strip().lower() in ("", "none", "null"):
        return None
    words = [w for a in args if typing.get_origin(a) is Literal for w in typing.get_args(a)]
    others = [a for a in args if typing.get_origin(a) is not Literal]
    if words and len(others) == 1:  # a number or a word, e.g. `int | Literal["auto"]`
        if raw in words:
            return raw
        (number,) = others
        try:
            return _parse_plain(name, number, raw)
        except ValuesError as exc:
            raise ValuesError(f"{exc} (or {' or '.join(words)})") from None
    return _parse_plain(name, args[0], raw)


def _parse_plain(name: str, hint: Any, raw: str) -> Any:
    label = key_label(name)
    if typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        if raw not in choices:
            raise ValuesError(f"{label}={raw!r} is not one of {', '.join(choices)}")
        return raw
    if hint is bool:
        return _strict(parse_bool, raw, label)
    if hint is int:
        return _strict(parse_int, raw, label, hi=SEED_MAX if name in _SEEDS else NUMBER_MAX)
    if hint is float:
        return _strict(parse_float, raw, label, hi=NUMBER_MAX)
    if hint is str:
        return raw
    raise ValuesError(f"{label} cannot be set from a string; see docs/k8s.md")  # maps go through KEY.sub=v


def split_override(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ValuesError(f"override {item!r} is not KEY=VALUE; e.g. NODES=4 or ENV.NCCL_DEBUG=INFO")
    try:
        item.encode("utf-8")
    except UnicodeEncodeError:  # bytes that were not UTF-8 arrive as lone surrogates
        shown = item.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
        raise ValuesError(
            f"override {shown} holds bytes that are not UTF-8; give the value as UTF-8 text"
        ) from None
    return key.strip(), value


def _field_for(key: str) -> str:
    name = key.replace("-", "_").lower()
    if name in field_names() and name not in MAP_FIELDS:
        return name
    keys = [key_label(n) for n in field_names() if n not in MAP_FIELDS] + [
        f"{p}.<name>" for p in MAP_FIELDS.values()
    ]
    close = difflib.get_close_matches(key.replace("-", "_").upper(), keys, n=1)
    hint = f"; did you mean {close[0]}?" if close else "; see docs/k8s.md for the keys"
    raise ValuesError(f"unknown value {key}{hint}")


def _map_field(key: str) -> tuple[str, str] | None:
    """(map field, the part after the dot) for `ENV.X`, `NODE_SELECTOR.k`, `TRAIN.s.f`; None otherwise."""
    prefix, dot, rest = key.partition(".")
    if not dot:
        return None
    for name, label in MAP_FIELDS.items():
        if label == prefix.upper().replace("-", "_"):
            return name, rest
    return None


def apply_overrides(base: dict[str, Any], overrides: list[str] | Mapping[str, str]) -> dict[str, Any]:
    """Return `base` (field -> value) updated by KEY=VALUE overrides, each parsed by its field's type.

    Each key may appear once: the second `NODES=` (any spelling of the same field, or the same map entry)
    raises ValuesError naming both.
    """
    items = (
        list(overrides.items()) if isinstance(overrides, Mapping) else [split_override(o) for o in overrides]
    )
    merged = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    seen: dict[tuple[str, ...], str] = {}
    for key, raw in items:
        mapped = _map_field(key)
        identity = (mapped[0], *mapped[1].split(".")) if mapped else (_field_for(key),)
        if identity in seen:
            raise ValuesError(
                f"{key} is given twice ({seen[identity]}, then {key}={raw}); give each key once"
            )
        seen[identity] = f"{key}={raw}"
        if mapped is not None:
            _set_map_entry(merged, *mapped, raw)
        else:
            merged[identity[0]] = parse_scalar(identity[0], raw)
    return merged


def _yaml_scalar(label: str, raw: str) -> Any:
    """A TRAIN.* value as the trainer's YAML file would hold it: int, float, bool, or the string itself."""
    for convert in (int, float):
        try:
            value = convert(raw)
        except ValueError:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise ValuesError(f"{label}={raw!r}: must be a finite number")
        return value
    low = raw.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    return raw


def _set_map_entry(merged: dict[str, Any], map_field: str, sub: str, raw: str) -> None:
    label = MAP_FIELDS[map_field]
    if map_field == "train":
        section, dot, name = sub.partition(".")
        if not dot or section not in TRAINER_FIELDS or not name.isidentifier():
            raise ValuesError(
                f"TRAIN.{sub} is not a trainer config field; sections: {', '.join(TRAINER_FIELDS)} "
                "(fields as in the trainer's config, e.g. TRAIN.optim.lr=1e-4)"
            )
        typed = TYPED_TRAINER_FIELDS.get((section, name))
        if typed is not None:
            raise ValuesError(f"TRAIN.{sub} has its own value; set {key_label(typed)}={raw} instead")
        merged.setdefault("train", {}).setdefault(section, {})[name] = _yaml_scalar(f"TRAIN.{sub}", raw)
        return
    if not sub:
        raise ValuesError(f"{label}.<name>={raw} needs a name after the dot, e.g. {label}.NCCL_DEBUG=INFO")
    merged.setdefault(map_field, {})[sub] = raw
