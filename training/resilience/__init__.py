"""The kit's public resilience API (version `API_VERSION`): what a training script calls to get the kit's
guarantees. Everything else under `training/` is private and may change between releases.

    from fsdpkit import resilience

    def build(job: resilience.Job, *, init_weights: bool) -> resilience.Session:
        model, optimizer, scheduler = ...                  # your model on job.ctx.mesh
        data = resilience.TokenDataset(path, seq_len=seq_len, plan=plan, rank=job.ctx.rank, seed=seed)
        state = resilience.TrainState(model=model, optimizer=optimizer, scheduler=scheduler, data=data,
                                      rank=job.ctx.rank, data_global=True)
        return resilience.Session(job, state)

    def train(job: resilience.Job, session: resilience.Session) -> None:
        while session.step < job.cfg.training.steps:
            with job.step(session) as step:                # planned faults, the step's bracket
                for inputs, targets in session.state.data.step_batches():
                    loss = compute_loss(inputs, targets) / plan.accum; loss.backward()
                with step.update():                        # optimizer + schedule: live state torn inside
                    optimizer.step(); optimizer.zero_grad(); scheduler.step()
                step.report(loss)                          # the one all-reduce: mean loss, drain, interval
            # leaving the block: the step event, the heartbeat, the checkpoint if due, the drain if agreed

    plan = resilience.plan_batch(resilience.load_config(rest_of_argv), micro_batch=B, world_size=W)
    resilience.leave(resilience.run(plan.config, build=build, train=train))

The public names:
- `load_config`, `ResilienceConfig`, `ConfigError`: the typed, frozen config (run, training, parallel,
  checkpoint, fault, inprocess, straggler), from `$KIT_CONFIG` (the Job's ConfigMap) or `--config`, with
  `--section.field` overrides. Your own sections: subclass `ResilienceConfig` with frozen dataclass fields
  and load it with `load_config(argv, root=YourConfig)`; they are read, overridden, documented (`help_text`)
  and checked (override `validate`, call super's) exactly as the kit's.
- `run`: the process's whole life: checks, process group, build, resume, train, in-process restarts, final
  save, exit code (0 done, 78 bad config, 143 drained after the agreed step committed).
- `Job`: the per-process parts the loop talks to (events, heartbeat, faults, drain): `job.step(session)`.
- `Session`: one process group's state and its asynchronous, verified checkpointer (rebuilt per restart).
- `TrainState`: a Stateful of model, optimizer, LR scheduler, data loader, RNG, step and user extras.
- `InjectedFault`: what an `exception` fault raises (so a script's own handler can let it through).
- `plan_batch(cfg, micro_batch=, world_size=)`: the micro-batches per rank (`.accum`) that keep the global
  batch (`training.global_batch`) exact on this world size, before any process group, and `.config`, the
  config with the plan in it: pass that one to `run`, and a checkpoint resumes on another world size too
  (resharded: the same global batches, every sample once).
- `TokenDataset(path, seq_len=, plan=, rank=, seed=)`: token data without a reader of your own: the kit's
  shards (kit-prepare-data) or a Megatron-LM .bin/.idx prefix, memory-mapped, in the kit's seeded order;
  this rank's micro-batches of each global batch (`step_batches()`), the global ids each step took
  (`step_samples`); Stateful, a global cursor (`data_global=True`). `TokenDataset.check` is the config check.
- `ParallelConfig`, `MeshLayout`: the `parallel` section (FSDP, or HSDP: `replicate` x `shard`) and the layout
  it resolves to; `job.ctx.mesh` is FSDP's mesh for it (1-D, or 2-D `("replicate", "shard")`): shard your
  model on it (`fully_shard(module, mesh=job.ctx.mesh)`) and FSDP2 does the rest.
- `leave(code)`: exit with `code` without the interpreter's teardown of torch's C++ state, which now and
  then aborts a process whose work is done (SIGABRT: a launcher would count a finished rank as failed).
- `API_VERSION`.
Heavy names (torch) load on first use, so the config can be read where torch is not installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fsdpkit.resilience.config import ConfigError, ResilienceConfig, load_config

if TYPE_CHECKING:
    from fsdpkit.resilience.batch import plan_batch
    from fsdpkit.resilience.dataset.tokens import TokenDataset
    from fsdpkit.resilience.faults import InjectedFault
    from fsdpkit.resilience.job import Job
    from fsdpkit.resilience.parallel import MeshLayout, ParallelConfig
    from fsdpkit.resilience.run import run
    from fsdpkit.resilience.session import Session
    from fsdpkit.resilience.state import TrainState
    from fsdpkit.runtime.process_exit import leave

API_VERSION = "2.2"
"""Semantic version of this surface: a name added bumps the minor number; a name removed, or a signature or
behaviour broken, the major (docs/own-model.md lists what each version changed)."""

_LAZY = {
    "Job": "fsdpkit.resilience.job",
    "Session": "fsdpkit.resilience.session",
    "TrainState": "fsdpkit.resilience.state",
    "run": "fsdpkit.resilience.run",
    "leave": "fsdpkit.runtime.process_exit",
    "InjectedFault": "fsdpkit.resilience.faults",
    "plan_batch": "fsdpkit.resilience.batch",
    "TokenDataset": "fsdpkit.resilience.dataset.tokens",
    "ParallelConfig": "fsdpkit.resilience.parallel",
    "MeshLayout": "fsdpkit.resilience.parallel",
}

__all__ = [
    "API_VERSION", "ConfigError", "InjectedFault", "Job", "MeshLayout", "ParallelConfig", "ResilienceConfig",
    "Session", "TokenDataset", "TrainState", "leave", "load_config", "plan_batch", "run",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fsdpkit.resilience' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
