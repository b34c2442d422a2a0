"""The optional parts of the kit's distribution, and the one line that names the extra a missing library
comes with: a console script run from a core install says what to install instead of a traceback."""

from __future__ import annotations

import importlib
from types import ModuleType

DISTRIBUTION = "eks-fsdp-resilience-kit"


class MissingExtra(ImportError):
    """A library of one of the kit's extras is not installed; the message is one line with the install."""


def install_line(extra: str) -> str:
    return f'pip install "{DISTRIBUTION}[{extra}]"'


def require(module: str, *, extra: str, needed_by: str) -> ModuleType:
    """Import `module`, or raise MissingExtra naming `needed_by`, the module and the extra to install."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or module.split(".")[0] != exc.name.split(".")[0]:
            raise
        raise MissingExtra(
            f"{needed_by} needs {module.split('.')[0]}, which is not installed: {install_line(extra)}"
        ) from None
