"""Resource counts per stack of a synthesized cloud assembly: `python -m fsdpkit.infra.summary [cdk.out]`.

Prints a markdown table (stack, resources, outputs, the most common types), the figures quoted in
docs/benchmarks/infra.md and docs/infra.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path


def summarize(outdir: Path) -> list[tuple[str, int, int, list[tuple[str, int]]]]:
    """(stack, resources, outputs, [(type, count), ...]) for every template in `outdir`, by stack name."""
    rows = []
    for path in sorted(outdir.glob("*.template.json")):
        template = json.loads(path.read_text(encoding="utf-8"))
        types = collections.Counter(r["Type"] for r in template.get("Resources", {}).values())
        rows.append(
            (
                path.name.removesuffix(".template.json"),
                types.total(),
                len(template.get("Outputs", {})),
                types.most_common(),
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", nargs="?", default="cdk.out", type=Path, help="cloud assembly folder")
    args = parser.parse_args(argv)
    rows = summarize(args.outdir)
    if not rows:
        print(f"error: no *.template.json in {args.outdir}; run `make synth` first", file=sys.stderr)
        return 2
    print("| stack | resources | outputs | most common types |")
    print("|---|---|---|---|")
    for stack, count, outputs, types in rows:
        top = ", ".join(f"{kind.split('::', 1)[1]} {n}" for kind, n in types[:4])
        print(f"| `{stack}` | {count} | {outputs} | {top} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
