"""Command-line parsing shared by the ops commands: `cliargs.OneLineParser`, plus "a flag given twice is an
error" (argparse lets the last one win silently: `--region us-east-1 --region eu-west-1` must not mean
"eu-west-1, and never mind"). The parsers are built with `allow_abbrev=False`: argparse would otherwise take
`--reg` for `--region`, and an abbreviation would slip past the count (`--reg a --region b`: last wins).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from fsdpkit.contracts.cliargs import OneLineParser


def parse_once(parser: OneLineParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse `argv`; a single-valued flag (or its --no- twin) given more than once is a one-line error."""
    if parser.allow_abbrev:
        raise ValueError(
            f"{parser.prog}: build the parser with allow_abbrev=False (abbreviations escape the count)"
        )
    args = parser.parse_args(argv)
    actions = parser._option_string_actions  # public enough: argparse has had it since 2.7
    seen: Counter[str] = Counter()
    names: dict[str, str] = {}
    for token in sys.argv[1:] if argv is None else argv:
        if token == "--":
            break
        action = actions.get(token.split("=", 1)[0]) if token.startswith("--") else None
        if action is None or isinstance(action, argparse._AppendAction):
            continue
        seen[action.dest] += 1
        names.setdefault(action.dest, action.option_strings[0])
        if seen[action.dest] == 2:
            parser.error(f"argument {names[action.dest]}: given more than once; give it once")
    return args
