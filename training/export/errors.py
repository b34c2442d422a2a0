"""The one error an export refuses with: a single line naming the value and the fix."""

from __future__ import annotations

SHOWN = 3
"""How many mismatches a refusal names before counting the rest."""


class ExportError(ValueError):
    """The export cannot go on; the message is one line (the CLI prints it and exits 78)."""


def listed(found: list[str], what: str) -> str:
    """`N <what>(es): the first SHOWN; and K more`, for a refusal that names the first of many."""
    more = f"; and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    plural = "es" if what.endswith(("ch", "sh", "s", "x")) else "s"
    return f"{len(found)} {what}{plural if len(found) > 1 else ''}: {'; '.join(found[:SHOWN])}{more}"
