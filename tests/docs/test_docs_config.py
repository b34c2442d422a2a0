"""docs/configuration.md matches the typed models it is generated from."""

from __future__ import annotations

import dataclasses
import importlib
import typing
from dataclasses import dataclass, field
from typing import Literal

import pytest

from tools import gen_config_docs as gen


def test_committed_reference_matches_the_models() -> None:
    committed = gen.OUTPUT.read_text(encoding="utf-8")
    assert committed == gen.generate(), "docs/configuration.md is stale: run `make docs-config` and commit it"


@pytest.mark.parametrize("model", gen.MODELS, ids=lambda m: m.name)
def test_every_field_of_a_landed_model_is_documented(model: gen.Model) -> None:
    try:
        root = getattr(importlib.import_module(model.module), model.name)
    except (ImportError, AttributeError):
        pytest.skip(f"{model.module}.{model.name} has not landed")
    text = gen.generate()

    def keys(cls: type, prefix: str = "") -> list[str]:
        out = []
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            if isinstance(tp, type) and dataclasses.is_dataclass(tp):
                out += keys(tp, f"{prefix}{f.name}.")
            else:
                out.append(f"{prefix}{f.name}")
        return out

    shown = [k.upper() if model.upper_keys else k for k in keys(root)]
    missing = [k for k in shown if f"| `{k}` |" not in text]
    assert not missing, f"fields missing from the reference: {missing}"


@dataclass(kw_only=True)
class _Inner:
    """Inner section summary."""

    mode: Literal["off", "sync"] = "sync"
    """How to save, in no unit."""
    limit: int | None = None
    """Upper bound in seconds; null means none."""


@dataclass(kw_only=True)
class _Root:
    name: str
    """Required name."""
    tags: tuple[str, ...] = ("a", "b")
    inner: _Inner = field(default_factory=_Inner)


def test_generic_walk_renders_types_defaults_docs_and_nesting() -> None:
    text = "\n".join(gen.document(_Root))
    assert "| `name` | str | **required** | Required name. |" in text
    assert "| `tags` | list of str | `[a, b]` | - |" in text
    assert "### `inner`\n\nInner section summary." in text
    assert "| `inner.mode` | `off` \\| `sync` | `sync` | How to save, in no unit. |" in text
    assert "| `inner.limit` | int \\| null | `null` | Upper bound in seconds; null means none. |" in text


def test_check_mode_reports_a_stale_file(tmp_path, capsys) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text("# old\n", encoding="utf-8")
    assert gen.main(["--check", "--output", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert gen.main(["--output", str(stale)]) == 0
    assert gen.main(["--check", "--output", str(stale)]) == 0
