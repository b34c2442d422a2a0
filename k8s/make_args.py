"""What make hands the k8s CLI, checked against what the user typed (make's own argv and environment).

make passes the recipe only its command line's variables (`$(MAKEOVERRIDES)`) and keeps only the last of
`NODES=4 NODES=5`, so two mistakes never reach the CLI's arguments: a key given twice, and a key set in the
environment (`DRY_RUN=1 make train-job` would apply; `NODES=8 make train-job` would render the default).
Both are read from Linux's /proc/<make pid>/{cmdline,environ} and refused; where /proc does not exist
(macOS) the checks are skipped (docs/k8s.md says so).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path

_TAKES_ARG = {"-C", "-f", "-I", "-o", "-W", "--directory", "--file", "--makefile", "--include-dir"}


class MakeLineError(ValueError):
    """make's command line or environment holds what the CLI would misread; one line."""


def make_assignments(argv: list[str]) -> list[tuple[str, str]]:
    """(name, item) of each `NAME=value` on a make command line, in order (options and their args skipped)."""
    found, skip = [], False
    for item in argv[1:]:
        if skip:
            skip = False
        elif item in _TAKES_ARG:
            skip = True
        elif m := re.match(r"([A-Za-z_][A-Za-z0-9_.-]*)\s*:{0,3}=", item):
            found.append((m.group(1), item))
    return found


def _make_proc(pid: int) -> tuple[list[str], list[str]] | None:
    """make's argv and initial environment; None where /proc cannot tell or the pid is not make's."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")[:-1]
        environ = Path(f"/proc/{pid}/environ").read_bytes().decode("utf-8", "replace").split("\0")[:-1]
    except OSError:
        return None
    if not argv or "make" not in Path(argv[0]).name:
        return None
    return argv, environ


def check_make(pid: int, *, known: Collection[str], given: Collection[str], target: str) -> None:
    """Refuse a key twice on make's command line, or a `known` key in make's environment that is not among
    the `given` ones (its command line's: make exports those to sub-makes, so they may be in both)."""
    proc = _make_proc(pid)
    if proc is None:
        return
    argv, environ = proc
    seen: dict[str, str] = {}
    for name, item in make_assignments(argv):
        if name in seen:
            raise MakeLineError(
                f"{name} is given twice on the make command line ({seen[name]}, then {item}); make keeps "
                "only the last one, so give it once"
            )
        seen[name] = item
    given_upper = {key.upper() for key in given}
    for entry in environ:
        name, _, value = entry.partition("=")
        if name.upper() in known and name.upper() not in given_upper:
            shown = value if len(value) <= 60 else value[:57] + "..."
            example = value if re.fullmatch(r"[\w./:,@+-]{1,60}", value) else "..."
            raise MakeLineError(
                f"{name}={shown!r} is set in the environment, and make passes on only its command line's "
                f"values: give it after the target (make {target} {name}={example}) or unset {name}"
            )
