"""Verified, asynchronous DCP checkpoints with memory tiers (see docs/checkpointing.md).

- when: `config` (the section), `schedule` (the interval, fixed or agreed), `interval` (Young/Daly's choice);
- save: `checkpointer` (the surface the Session uses), `savers` (sync, the kit's async, DCP's async),
  `staging` and `staging_gate` (the host copy the optimizer waits for), `inflight`, `shards` and `writer`
  (this rank's file), `planner`, `worker`, `guard`, `finish` (gather, commit, prune), `commit` (the
  record), `retention`, `layout`;
- restore: `restore`, `resume` (the newest commit that verifies), `reshard` (another world size),
  `shared_reads`, `compare`;
- memory tiers: `tier_hook`, `memory_tiers`, `tier`, `blob`, `transfer`, `comm`;
- untrusted bytes: `untrusted` (`.metadata` through an allowlisted unpickler, byte items through
  `weights_only=True`), `wire` (tagged JSON for blob headers and messages between ranks: never a pickle).

Import from the submodules. This file imports nothing: the config check that `make train-job` and `k8s
local` run needs only `config` and would otherwise import torch and DCP (~3 s of CPU) for nothing.
"""
