"""The trainer: `python -m fsdpkit.trainer [--config FILE.yaml] [--section.field VALUE ...]`.

A Llama-style decoder trained with FSDP2 (`fully_shard` per block, then the root), AdamW, linear warmup
then cosine decay, gradient clipping, bf16 mixed precision on GPU. Runs under any launcher that sets the
torch.distributed environment (torchrun, `python -m fsdpkit.launcher`, NVRx's ft_launcher), or alone.

Exit codes: 0 done; 78 bad config (one line on stderr, no traceback); 143 drained (SIGTERM: the job
saved and committed the agreed step: fsdpkit.resilience); anything else is a real failure, recorded by
torch.distributed.elastic's `@record` for the launcher (its file written atomically:
fsdpkit.runtime.error_file).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from fsdpkit import resilience
from fsdpkit.contracts import exitcodes, throughput
from fsdpkit.trainer import memory_plan
from fsdpkit.trainer.config import ConfigError, OptimConfig, TrainConfig, help_text, load_config, model_shape
from fsdpkit.trainer.data import TokenLoader
from fsdpkit.trainer.hf_model import HfModelError, build_hf_model, check_weights, has_weights, hf_loss
from fsdpkit.trainer.model import build_model, loss_fn


def lr_schedule(cfg: OptimConfig, total_steps: int) -> Callable[[int], float]:
    """Multiplier of cfg.lr at scheduler step i (0-based): linear warmup, then cosine down to min_lr."""
    floor = cfg.min_lr / cfg.lr

    def factor(i: int) -> float:
        if i < cfg.warmup_steps:
            return (i + 1) / cfg.warmup_steps
        span = max(1, total_steps - cfg.warmup_steps)
        progress = min(1.0, (i - cfg.warmup_steps) / span)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


class KitTrainer:
    """The kit's own model, data and loop: one user of the public resilience API (fsdpkit.resilience),
    exactly as a user's script is (examples/hf_llama/train.py)."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.shape = model_shape(cfg)
        self._flops_token: float | None = None
        self._peak: float | None = None
        self._consumed: tuple[int, int] | None = None
        """The last step's first global sample and how many samples it consumed (all ranks together)."""

    def build(self, job: resilience.Job, *, init_weights: bool = True) -> resilience.Session:
        """Model (initialised from the seed; `init_weights=False`: left as allocated, for a caller that
        restores every value at once), optimizer, schedule, data at position 0, on `job.ctx`."""
        cfg, ctx = self.cfg, job.ctx
        assert ctx is not None
        param_dtype = torch.bfloat16 if ctx.device.type == "cuda" else None
        if cfg.model.hf_path:
            model = build_hf_model(
                cfg.model.hf_path, mesh=ctx.mesh, device=ctx.device, seed=cfg.run.seed,
                param_dtype=param_dtype, activation_checkpointing=cfg.model.activation_checkpointing,
                init_weights=init_weights,
            )  # fmt: skip
        else:
            model = self._own_model(ctx, param_dtype=param_dtype, init_weights=init_weights)
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=cfg.optim.lr,
            betas=(cfg.optim.beta1, cfg.optim.beta2),
            weight_decay=cfg.optim.weight_decay,
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(cfg.optim, cfg.training.steps))
        data = self._data(ctx.rank, ctx.world_size)
        state = resilience.TrainState(  # the sample cursor is global: a resume on other ranks reshards
            model=model, optimizer=optimizer, scheduler=scheduler, data=data, rank=ctx.rank, data_global=True
        )
        return resilience.Session(job, state)

    def _data(self, rank: int, world_size: int) -> resilience.TokenDataset | TokenLoader:
        """The token source at sample 0: the shards or a Megatron-LM prefix through the API's dataset (each
        global batch split by the plan for this world size), or the synthetic stream (the same split)."""
        cfg = self.cfg
        if cfg.data.kind == "synthetic":
            return TokenLoader(
                cfg.data,
                vocab_size=self.shape.vocab_size,
                seed=cfg.run.seed,
                rank=rank,
                world_size=world_size,
            )
        plan = resilience.plan_batch(cfg, micro_batch=cfg.data.batch_size, world_size=world_size)
        return resilience.TokenDataset(
            cfg.data.path, seq_len=cfg.data.seq_len, plan=plan, rank=rank, seed=cfg.run.seed,
            vocab_size=self.shape.vocab_size, option="data.path",
        )  # fmt: skip

    def _own_model(self, ctx, *, param_dtype: torch.dtype | None, init_weights: bool) -> torch.nn.Module:
        cfg = self.cfg
        return build_model(
            self.shape,
            mesh=ctx.mesh,
            device=ctx.device,
            seed=cfg.run.seed,
            param_dtype=param_dtype,
            activation_checkpointing=cfg.model.activation_checkpointing,
            compile_blocks=cfg.model.compile,
            init_weights=init_weights,
        )

    def loss(self, model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.cfg.model.hf_path:
            return hf_loss(model, inputs, targets)
        return loss_fn(model(inputs), targets)

    def train(self, job: resilience.Job, session: resilience.Session) -> None:
        while session.step < job.last_step:
            self.train_step(job, session)

    def train_step(self, job: resilience.Job, session: resilience.Session) -> float | None:
        """One optimizer step over this rank's next `accum` micro-batches; returns the loss averaged over
        ranks. Each micro-batch's loss is divided by `accum` so the summed gradients are the mean over the
        step's samples; FSDP2 reduces after every backward and accumulates into the sharded gradients."""
        cfg, state = self.cfg, session.state
        device = job.ctx.device if job.ctx is not None else torch.device("cpu")
        accum = cfg.training.grad_accum_steps
        with job.step(session) as step:
            first = state.data.samples_consumed
            total = torch.zeros((), device=device)
            for _ in range(accum):
                inputs, targets = state.data.next_batch()
                loss = self.loss(session.model, inputs.to(device), targets.to(device)) / accum
                loss.backward()
                total += loss.detach()
            self._consumed = (first, state.data.samples_consumed - first)
            if cfg.optim.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(session.model.parameters(), cfg.optim.grad_clip)
            with step.update():
                session.optimizer.step()
                session.optimizer.zero_grad(set_to_none=True)
                state.scheduler.step()
            step.report(total)
        return step.loss

    def step_fields(self, duration_s: float) -> dict[str, float | int | None]:
        """Tokens/s of this rank (one GPU) and MFU for a step that took `duration_s` (the step event's), and
        the global samples the step consumed: the first one's index and how many (the global batch, the
        same at every world size), and its tokens (`samples x data.seq_len`: tokens per optimizer step)."""
        cfg, args = self.cfg, self.shape
        if self._flops_token is None:
            self._flops_token = throughput.flops_per_token(  # a tied output matrix still costs its matmul
                params=args.num_params() + (args.vocab_size * args.dim if args.tied_embeddings else 0),
                vocab_size=args.vocab_size,
                dim=args.dim,
                n_layers=args.n_layers,
                seq_len=cfg.data.seq_len,
            )
            on_gpu = torch.cuda.is_available()
            self._peak = throughput.peak_flops(torch.cuda.get_device_name() if on_gpu else "cpu")
        tokens = cfg.data.batch_size * cfg.data.seq_len * cfg.training.grad_accum_steps
        rate = throughput.measure(
            tokens=tokens, duration_s=duration_s, flops_token=self._flops_token, peak=self._peak
        )
        first, count = self._consumed or (None, None)
        return {
            "tokens_per_s": rate.tokens_per_s, "mfu": rate.mfu, "sample_first": first, "samples": count,
            "tokens": None if count is None else count * cfg.data.seq_len,
        }  # fmt: skip

    def on_finish(self, job: resilience.Job, session: resilience.Session) -> None:
        if self.cfg.training.dump_final:
            dump_full_state(session, Path(self.cfg.training.dump_final), rank=job.rank)

    def on_job(self, job: resilience.Job) -> None:
        job.step_fields = self.step_fields


def dump_full_state(session: resilience.Session, path: Path, *, rank: int) -> None:
    """Rank 0 writes the unsharded model and optimizer state (a collective: every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(session.model, session.optimizer, options=opts)
    if rank == 0:
        tmp = path.with_name(path.name + ".tmp")
        torch.save({"step": session.state.step, "model": model_sd, "optim": optim_sd}, tmp)
        tmp.replace(path)


def check_memory(cfg: TrainConfig) -> tuple[str, TrainConfig]:
    """The memory plan's line for this job and the config with its layout planned (`parallel.replicate=auto`:
    the smallest shard group that fits), or ConfigError with the fixes: before any process group, so a job
    that cannot fit fails at once (exit 78) instead of in a CUDA OOM after the nodes were paid for."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    host = memory_plan.host_memory_bytes()
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        capacity = torch.cuda.get_device_properties(int(os.environ.get("LOCAL_RANK", "0"))).total_memory
    else:
        capacity = host // max(1, local)
    shape = model_shape(cfg)
    machine = {"device_capacity": capacity, "host_capacity": host, "on_gpu": on_gpu}
    try:
        layout = memory_plan.plan_layout(cfg, shape, world=world, ranks_per_node=local, **machine)
        cfg = dataclasses.replace(
            cfg, parallel=resilience.ParallelConfig(replicate=layout.replicate, shard=layout.shard)
        )
        line = memory_plan.plan_line(
            cfg, shape, world=world, ranks_per_node=local, shard_group=layout.shard, **machine
        )
    except memory_plan.MemoryPlanError as exc:
        raise ConfigError(str(exc)) from None
    return line, cfg


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(help_text())
        return exitcodes.OK
    try:
        cfg = load_config(argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exitcodes.FATAL_CONFIG
    try:
        batch = resilience.plan_batch(  # the config with training.global_batch and grad_accum_steps planned
            cfg, micro_batch=cfg.data.batch_size, world_size=int(os.environ.get("WORLD_SIZE", "1"))
        )
        plan_line, cfg = check_memory(batch.config)
        if cfg.model.hf_path and has_weights(cfg.model.hf_path):  # before any group: one line, not rank 37
            check_weights(cfg.model.hf_path)
    except (ConfigError, HfModelError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exitcodes.FATAL_CONFIG
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"[trainer] {plan_line}", flush=True)
        print(f"[trainer] {batch.line()}", flush=True)
    trainer = KitTrainer(cfg)
    return resilience.run(
        cfg,
        build=trainer.build,
        train=trainer.train,
        on_finish=trainer.on_finish,
        start_fields={"model": cfg.model.name}
        if not cfg.model.hf_path
        else {"model": "hf", "hf_path": cfg.model.hf_path},
        on_job=trainer.on_job,
    )


def entry() -> None:
    """The `kit-train` console script: exits without the interpreter's teardown (resilience.leave)."""
    resilience.leave(main())


if __name__ == "__main__":
    entry()
