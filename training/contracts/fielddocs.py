"""Attribute docstrings of the kit's typed configs: the one reader behind `--help`, docs/*.md and the
generated configuration reference. Standard library only, so every part may import it (design, folders)."""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import textwrap


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the string literal right under the field (whitespace folded), read from the source."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # no source (e.g. a frozen build): the docs are optional
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, nxt in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs
