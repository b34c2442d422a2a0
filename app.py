#!/usr/bin/env python3
"""CDK entry point: read and validate the kit config from context, then build the stacks.

A bad setting prints one line `error: <key>: <problem>` to stderr and exits 2, before any construct exists.
"""

from __future__ import annotations

import datetime as dt
import os
import sys

# jsii prints a multi-line banner on Node 20 (end of life) in every process; the kit pins its Node tooling.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")

import aws_cdk as cdk

from fsdpkit.infra.config import load_config
from fsdpkit.infra.errors import ConfigError
from fsdpkit.infra.notices import synth_notices
from fsdpkit.infra.stacks import build_kit

USAGE_EXIT = 2


def main() -> int:
    """Synthesize the kit; return the process exit status."""
    app = cdk.App()
    try:
        cfg = load_config(app.node.get_all_context())
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return USAGE_EXIT
    for line in synth_notices(cfg, dt.datetime.now(dt.UTC).date()):
        print(line, file=sys.stderr)
    build_kit(app, cfg)
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
