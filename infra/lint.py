"""cfn-lint over a synthesized cloud assembly, for the regions its stacks deploy to.

`python -m infra.lint [cdk.out]` runs cfn-lint with the kit's settings (`infra/cfnlint.yaml`) and the regions
read from the assembly's manifest, so region-specific checks (e.g. "instance type not offered in this region",
E3628) use the configured region, not cfn-lint's default us-east-1. Exit status is cfn-lint's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CONFIG = Path(__file__).with_name("cfnlint.yaml")


def assembly_regions(outdir: Path) -> list[str]:
    """Regions of the CloudFormation stacks in `outdir/manifest.json` (environment `aws://account/region`)."""
    manifest = json.loads((outdir / "manifest.json").read_text(encoding="utf-8"))
    regions = {
        artifact["environment"].rsplit("/", 1)[-1]
        for artifact in manifest.get("artifacts", {}).values()
        if artifact.get("type") == "aws:cloudformation:stack"
    }
    return sorted(regions)


def cfn_lint_command(outdir: Path) -> list[str]:
    """The cfn-lint command line for every template in `outdir`."""
    templates = sorted(str(p) for p in outdir.glob("*.template.json"))
    cfn_lint = Path(sys.executable).with_name("cfn-lint")
    return [
        str(cfn_lint),
        "--config-file",
        str(CONFIG),
        "--regions",
        *assembly_regions(outdir),
        "--",
        *templates,
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="cfn-lint the synthesized templates for their regions")
    parser.add_argument("outdir", nargs="?", default="cdk.out", type=Path, help="cloud assembly folder")
    args = parser.parse_args(argv)
    if not (args.outdir / "manifest.json").exists():
        print(f"error: no cloud assembly in {args.outdir}; run `make synth` first", file=sys.stderr)
        return 2
    return subprocess.run(cfn_lint_command(args.outdir), check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
