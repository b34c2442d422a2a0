"""Verified, asynchronous DCP checkpoints (see docs/checkpointing.md).

Import from the submodules (`training.resilience.checkpoint.config`, `.checkpointer`, `.resume`). This file
imports
nothing: `training.trainer.config` needs only CheckpointConfig, and the config check that `make train-job` and
`k8s local` run before anything is applied would otherwise import torch and DCP (~3 s of CPU) for nothing.
"""
