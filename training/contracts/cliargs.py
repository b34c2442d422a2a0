"""Strict parsing of command-line values, shared by `k8s/`, `ops/` and the trainer's entry points.

A value that is not understood is an error with one line that names it, never a default: `DRY_RUN=y` must not
mean "apply", and `--timeout nan` must not mean "wait forever". Standard library only: any part may
import it.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
_NON_FINITE = re.compile(r"[+-]?(nan|inf|infinity)", re.IGNORECASE)
"""ASCII only: Python's int() and float() also take '1_000' and other scripts' digits, which nobody types on
purpose into a node count."""


def parse_bool(text: str | bool | None, name: str) -> bool:
    """`1/true/yes/on` or `0/false/no/off` (any case); None (not given) is False; anything else, the empty
    string included (`DRY_RUN=` says nothing), raises ValueError naming `name`."""
    if isinstance(text, bool):
        return text
    if text is None:
        return False
    low = text.strip().lower()
    if low in TRUE_WORDS:
        return True
    if low in FALSE_WORDS:
        return False
    raise ValueError(
        f"{name}={text!r}: not a boolean; use one of {'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)}"
    )


def parse_float(
    text: str | float,
    name: str,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
) -> float:
    """A finite float in [lo, hi] (or (lo, hi] with `lo_open`); nan, inf and out-of-range raise ValueError."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ValueError(f"{name}={text!r}: not a number")
    if isinstance(text, str):
        stripped = text.strip()
        if _NON_FINITE.fullmatch(stripped):
            raise ValueError(f"{name}={text!r}: must be a finite number")
        if not _FLOAT.fullmatch(stripped):
            raise ValueError(f"{name}={text!r}: not a number")
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{name}={text!r}: must be a finite number")
    _check_range(value, text, name, lo, hi, lo_open)
    return value


def parse_int(text: str | int, name: str, *, lo: int | None = None, hi: int | None = None) -> int:
    """A whole number in [lo, hi]; `1.5`, `1e3`, `nan` and out-of-range raise ValueError naming `name`."""
    if isinstance(text, bool) or not (isinstance(text, int) or _INT.fullmatch(str(text).strip())):
        raise ValueError(f"{name}={text!r}: not a whole number")
    value = int(str(text).strip(), 10)
    _check_range(value, text, name, lo, hi, False)
    return value


def _check_range(value, text, name, lo, hi, lo_open) -> None:
    if lo is not None and (value <= lo if lo_open else value < lo):
        bound = f"greater than {lo}" if lo_open else f"at least {lo}"
        raise ValueError(f"{name}={text!r}: must be {bound}")
    if hi is not None and value > hi:
        raise ValueError(f"{name}={text!r}: must be at most {hi}")


def float_arg(
    *, lo: float | None = None, hi: float | None = None, lo_open: bool = False
) -> Callable[[str], float]:
    """An argparse `type=` for a finite float in range; argparse turns the message into one `error:` line."""

    def convert(text: str) -> float:
        try:
            return parse_float(text, "value", lo=lo, hi=hi, lo_open=lo_open)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("value=")) from None

    convert.__name__ = "number"
    return convert


def int_arg(*, lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    """An argparse `type=` for a whole number in range."""

    def convert(text: str) -> int:
        try:
            return parse_int(text, "value", lo=lo, hi=hi)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("value=")) from None

    convert.__name__ = "whole number"
    return convert


def program(default: str) -> str:
    """The name a person typed: the console script (`kit-report`) when one started this process, else
    `default` (`python -m fsdpkit.analysis.report`), so usage and error lines show what to type again."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return name if name.startswith("kit-") else default


class OneLineParser(argparse.ArgumentParser):
    """argparse that answers a bad command line with one `prog: error: ...` line (no usage block), exit 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _folder_reason(folder: Path) -> str | None:
    """Why `folder` cannot be made or written into, as a clause about it; None when it looks fine."""
    if folder.exists() and not folder.is_dir():
        return f"{str(folder)!r} is a file, not a folder"
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return f"{str(probe)!r} is a file, so {str(folder)!r} cannot be created"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{str(probe)!r} is not writable"
    return None


def output_folder_problem(path: str | os.PathLike[str], name: str) -> str | None:
    """Why the folder `name` gives (`OUT=`, `--workdir`, ...) cannot be made or written, in one line naming
    it; None when it looks fine. Nothing is created: a dry run stays one. The nearest existing folder on the
    way must be a writable folder; the caller still names `name` if the write itself fails later."""
    reason = _folder_reason(Path(path))
    return None if reason is None else f"{name}={str(path)!r}: {reason}; pick a folder you can write"


def output_file_problem(path: str | os.PathLike[str], name: str) -> str | None:
    """Why the file `name` gives (`--png`, `--summary-json`, ...) cannot be written, in one line naming it;
    None when it looks fine (nothing is created)."""
    target = Path(path)
    if target.is_dir():
        return f"{name}={str(target)!r}: is a folder; give a file path"
    reason = _folder_reason(target.parent)
    if reason is None and target.exists() and not os.access(target, os.W_OK):
        reason = f"{str(target)!r} is not writable"
    return None if reason is None else f"{name}={str(target)!r}: {reason}; pick a path you can write"
