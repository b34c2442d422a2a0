"""Generate docs/configuration.md from the typed config and values models, so the reference cannot drift.

`python -m tools.gen_config_docs` rewrites the file; `--check` exits 1 when the committed file differs from
what the models give now (CI and `tests/docs` use it). The walk is generic: every dataclass field becomes a
row (key, type, default, the docstring written under the field); a field whose type is itself a dataclass
becomes a nested section. A model whose module is not importable is listed with a note, not an error.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fsdpkit.contracts.fielddocs import field_docs

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "docs" / "configuration.md"


@dataclass(frozen=True, kw_only=True)
class Model:
    """One documented model: where it lives and how users set its keys."""

    title: str
    module: str
    name: str
    how: str
    """One paragraph: where the keys are set and which source wins."""
    upper_keys: bool = False
    """Show keys as users type them on the command line, upper-case (NODES=4), instead of field names."""


MODELS: tuple[Model, ...] = (
    Model(
        title="Stacks (`cdk.json` context)",
        module="fsdpkit.infra.config",
        name="KitConfig",
        how="Set in `cdk.json` under `context`, or per command with `-c key=value` (which wins). "
        "Values given with `-c` are strings parsed by the field's type; lists as JSON or comma-separated; "
        "`null` unsets.",
    ),
    Model(
        title="Trainer (`python -m fsdpkit.trainer`)",
        module="fsdpkit.trainer.config",
        name="TrainConfig",
        how="Set in a YAML file with one mapping per section (`--config FILE.yaml`), or per run with "
        "`--section.field VALUE`. Command line beats the file, which beats the defaults; "
        "unknown keys are errors.",
    ),
    Model(
        title="Kubernetes job values (`make train-job`, `make train-local`)",
        module="fsdpkit.k8s.values",
        name="JobValues",
        how="Defaults, then the stack outputs file, then overrides from the command line "
        "(`make train-job NODES=4 MODEL=llama3.1-8b`). Validated before anything is rendered. Mapping keys "
        "take one entry per override: `ENV.<NAME>=...`, `NODE_SELECTOR.<label>=...`, "
        "`TRAIN.<section>.<field>=...`.",
        upper_keys=True,
    ),
)


def type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(type_name(a) for a in args)
    if origin in (tuple, list, Sequence, frozenset, set):
        return f"list of {type_name(args[0])}" if args else "list"
    if origin in (dict, typing.Mapping, types.MappingProxyType) or tp is types.MappingProxyType:
        return "mapping" if not args else f"mapping of {type_name(args[0])} to {type_name(args[1])}"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def default_text(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "**required**"
    if isinstance(value, types.MappingProxyType):
        value = dict(value)
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple | list | frozenset | set):
        return "`[" + ", ".join(str(v) for v in value) + "]`" if value else "`[]`"
    if isinstance(value, str) and value == "":
        return '`""`'
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") if "\\|" not in text else text


def document(cls: type, prefix: str = "", level: int = 3, *, upper: bool = False) -> list[str]:
    """Markdown for one dataclass: a table of its plain fields, then one section per nested dataclass."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    rows: list[str] = []
    nested: list[str] = []
    for f in dataclasses.fields(cls):
        tp = hints.get(f.name, f.type)
        key = f"{prefix}{f.name}"
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            nested.append(f"{'#' * level} `{key}`")
            nested.append("")
            summary = (tp.__doc__ or "").strip().split("\n\n")[0]
            if summary and not summary.startswith(f"{tp.__name__}("):
                nested += [" ".join(summary.split()), ""]
            nested += document(tp, f"{key}.", level + 1, upper=upper)
            continue
        doc = docs.get(f.name, "")
        shown = key.upper() if upper else key
        rows.append(f"| `{shown}` | {type_name(tp)} | {_cell(default_text(f))} | {_cell(doc) or '-'} |")
    out: list[str] = []
    if rows:
        out += ["| key | type | default | meaning |", "|---|---|---|---|", *rows, ""]
    return out + nested


def generate() -> str:
    lines = [
        "# Configuration reference",
        "",
        "<!-- GENERATED by `python -m tools.gen_config_docs` from the typed models; do not edit by hand. -->",
        "",
        "Every setting of the kit, read from the models the code validates with, so this page cannot drift.",
        "Each model checks its values once at the edge and answers a bad one with a one-line error that",
        "names the key, the rule and the fix.",
        "",
    ]
    for model in MODELS:
        lines += [f"## {model.title}", "", f"Model: `{model.module}.{model.name}`. {model.how}", ""]
        try:
            cls = getattr(importlib.import_module(model.module), model.name)
        except (ImportError, AttributeError) as exc:
            lines += [f"> Not available in this checkout ({type(exc).__name__}: {exc}).", ""]
            continue
        lines += document(cls, upper=model.upper_keys)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.gen_config_docs", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from the models")
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"default {OUTPUT.relative_to(REPO)}")
    args = parser.parse_args(argv)
    text = generate()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(
                f"error: {args.output} is out of date; run `make docs-config` and commit it", file=sys.stderr
            )
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
