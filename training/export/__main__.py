"""`python -m fsdpkit.export RUN_DIR OUT`: the `kit-export-hf` console script."""

from fsdpkit.export.cli import entry

entry()
