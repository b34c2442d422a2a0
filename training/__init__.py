"""The FSDP trainer, its checkpoints, the heartbeat launcher, fault injection and goodput metrics.

Plain PyTorch: nothing here imports AWS or CDK code (design, folders table).
"""
