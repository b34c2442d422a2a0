"""Verified, asynchronous DCP checkpoints (see docs/checkpointing.md)."""

from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.config import CheckpointConfig
from training.checkpoint.resume import CheckpointError

__all__ = ["CheckpointConfig", "CheckpointError", "Checkpointer"]
