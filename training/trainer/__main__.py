"""`python -m fsdpkit.trainer [--config FILE.yaml] [--section.field VALUE ...]` (or `kit-train`)."""

from fsdpkit.trainer.train import entry

entry()
