"""Verified, asynchronous DCP checkpoints (see docs/checkpointing.md)."""

from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.config import CheckpointConfig
from training.checkpoint.resume import CheckpointError, check_world_size

__all__ = ["CheckpointConfig", "CheckpointError", "Checkpointer", "check_world_size"]
