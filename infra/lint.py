"""cfn-lint over a synthesized cloud assembly, each template for the region its stack deploys to.

`python -m fsdpkit.infra.lint [cdk.out]` runs cfn-lint with the kit's settings (`infra/cfnlint.yaml`), once
per region
read from the assembly's manifest and over that region's templates only, so region-specific checks (e.g.
"instance type not offered in this region", E3628) use the stack's own region, not cfn-lint's default
us-east-1 nor another stack's region. Exit status is the worst of cfn-lint's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CONFIG = Path(__file__).with_name("cfnlint.yaml")


def templates_by_region(outdir: Path) -> dict[str, list[str]]:
    """Region -> template paths of the CloudFormation stacks in `outdir/manifest.json` (environment
    `aws://account/region`); each template is linted only for the region it deploys to."""
    manifest = json.loads((outdir / "manifest.json").read_text(encoding="utf-8"))
    found: dict[str, list[str]] = {}
    for artifact in manifest.get("artifacts", {}).values():
        if artifact.get("type") == "aws:cloudformation:stack":
            region = artifact["environment"].rsplit("/", 1)[-1]
            found.setdefault(region, []).append(str(outdir / artifact["properties"]["templateFile"]))
    return {region: sorted(paths) for region, paths in sorted(found.items())}


def cfn_lint_commands(outdir: Path) -> list[list[str]]:
    """One cfn-lint command line per region, over that region's templates in `outdir`."""
    cfn_lint = Path(sys.executable).with_name("cfn-lint")
    return [
        [str(cfn_lint), "--config-file", str(CONFIG), "--regions", region, "--", *templates]
        for region, templates in templates_by_region(outdir).items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="cfn-lint the synthesized templates for their regions")
    parser.add_argument("outdir", nargs="?", default="cdk.out", type=Path, help="cloud assembly folder")
    args = parser.parse_args(argv)
    if not (args.outdir / "manifest.json").exists():
        print(f"error: no cloud assembly in {args.outdir}; run `make synth` first", file=sys.stderr)
        return 2
    codes = [subprocess.run(command, check=False).returncode for command in cfn_lint_commands(args.outdir)]
    return max(codes, default=0)


if __name__ == "__main__":
    sys.exit(main())
