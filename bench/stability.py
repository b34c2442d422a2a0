"""Do consecutive runs of a benchmark agree? `--check-stability A.json B.json C.json` of every bench.

The criterion: three full runs on an idle machine agree within 10 % on every RESULT ratio (a figure that moves
more than that between idle runs cannot back a claim). A ratio's spread is (max - min) / min across the runs'
medians; a count (restarts, lost steps, survived) agrees only when it is the same in every run; a figure
missing or not finite in any run fails. One module so that every benchmark judges the same way and prints the
same table.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOLERANCE = 0.10
"""The largest relative spread, (max - min) / min, at which three full runs on an idle machine agree on a
RESULT ratio."""


@dataclass(frozen=True, kw_only=True)
class Stability:
    key: str
    values: tuple[float | None, ...]
    spread: float | None
    """Ratios: (max - min) / min across the runs; counts: 0 if all equal, else inf; None if a run lacks it."""
    ok: bool


def stability(
    runs: Sequence[Mapping[str, float | None]],
    keys: Sequence[str],
    *,
    counts: Sequence[str] = (),
    tolerance: float = TOLERANCE,
) -> list[Stability]:
    """One row per figure of `keys`, in that order: do the runs agree on it?"""
    rows = []
    for key in keys:
        values = tuple(run.get(key) for run in runs)
        present = [v for v in values if v is not None and math.isfinite(v)]
        spread: float | None = None
        if len(present) == len(values) and present:
            low, high = min(present), max(present)
            if key in counts:
                spread = 0.0 if low == high else math.inf
            else:
                spread = 0.0 if low == high else (high - low) / low if low > 0 else math.inf
        rows.append(
            Stability(key=key, values=values, spread=spread, ok=spread is not None and spread <= tolerance)
        )
    return rows


def number(value: Any) -> float | None:
    """A RESULT figure as --json wrote it: a number, or [median, min, max] (the median counts)."""
    if isinstance(value, list) and value:
        value = value[0]
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def check_stability(
    paths: Sequence[str | Path],
    keys: Sequence[str],
    *,
    bench: str,
    counts: Sequence[str] = (),
    read: Callable[[Any], Mapping[str, Any]] = lambda data: data["result"],
) -> int:
    """Print a line per RESULT figure, then the verdict; exit 0 when every figure agrees, 1 when one does
    not, 2 when a file is not a `bench` --json record (one line naming it)."""
    if len(paths) < 2:
        print(f"error: --check-stability needs 2 or more --json files, got {len(paths)}", file=sys.stderr)
        return 2
    runs = []
    for path in map(Path, paths):
        try:
            result = read(json.loads(path.read_text(encoding="utf-8")))
            if not isinstance(result, dict):
                raise TypeError("'result' is not an object")
            runs.append({k: number(v) for k, v in result.items()})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"error: {path} is not a {bench} --json file ({exc}); rerun with --json", file=sys.stderr)
            return 2
    rows = stability(runs, keys, counts=counts)
    print(f"{'figure':22} {'runs':36} {'spread':>8}  (criterion: ratios within {TOLERANCE:.0%}"
          + (", counts equal)" if counts else ")"))  # fmt: skip
    for row in rows:
        values = ", ".join("nan" if v is None else f"{v:g}" for v in row.values)
        spread = "-" if row.spread is None else "differ" if math.isinf(row.spread) else f"{row.spread:.1%}"
        print(f"{row.key:22} {values:36} {spread:>8}  {'ok' if row.ok else 'NOT STABLE'}")
    failed = [r.key for r in rows if not r.ok]
    print(f"stable: {'yes' if not failed else 'no (' + ', '.join(failed) + ')'} across {len(runs)} runs")
    return 0 if not failed else 1
