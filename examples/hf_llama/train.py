"""Train a Hugging Face causal LM on your own tokenized data with the kit's resilience API.

    python examples/hf_llama/train.py --model-dir MODEL --data-dir DATA [--steps N ...] [--run.id ID ...]

MODEL is a local folder with a `config.json` (e.g. a Llama config; with `model.safetensors` the weights are
loaded, else initialised from the seed); DATA is the folder `kit-prepare-data` wrote from your text with your
`tokenizer.json`, or the prefix of a Megatron-LM dataset (PREFIX.bin + PREFIX.idx). Options after the
script's own (`--section.field VALUE`) and the Job's config file (`$KIT_CONFIG`) set the kit's sections: run,
training, checkpoint, fault, inprocess, straggler. `--plain` runs the same model, data and optimizer in a
plain loop with no kit call (the benchmark's baseline: no checkpoints, no faults, no restarts).

Everything this script needs from the kit is `from fsdpkit import resilience` (its data too:
`resilience.TokenDataset`); the rest is PyTorch and `transformers`. Copy it and change the model, the loss
and the loop; keep the three rules that make a resume bitwise equal to a run without faults
(docs/own-model.md): every value that changes during training is in the TrainState (model, optimizer,
schedule, data position, RNG), the data a step reads depends only on the data position, and the optimizer
step sits inside `step.update()`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from fsdpkit import resilience

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder only: never a model hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def build_model(model_dir: str, *, mesh, seed: int) -> torch.nn.Module:
    """The HF model from its config on the meta device, `fully_shard` per decoder layer then the root,
    materialised shard by shard; weights from `model.safetensors` if the folder has them, else HF's init."""
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    torch.manual_seed(seed)
    model.apply(model._init_weights)
    for module in model.modules():  # non-persistent buffers (rotary frequencies) are not in any file
        if hasattr(module, "rope_init_fn"):
            inv_freq, module.attention_scaling = module.rope_init_fn(module.config, "cpu")
            module.inv_freq, module.original_inv_freq = inv_freq, inv_freq
    weights = Path(model_dir) / "model.safetensors"
    if weights.is_file():
        from safetensors.torch import load_file
        from torch.distributed.tensor import distribute_tensor

        full = load_file(weights)
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(
                    distribute_tensor(full[name].to(param.dtype), param.device_mesh, param.placements)
                )
    return model


def cosine(warmup: int, total: int, floor: float = 0.1):
    def factor(i: int) -> float:
        if i < warmup:
            return (i + 1) / warmup
        return floor + (1 - floor) * 0.5 * (
            1 + math.cos(math.pi * min(1.0, (i - warmup) / max(1, total - warmup)))
        )

    return factor


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model-dir", required=True, help="folder with config.json (and optionally model.safetensors)"
    )
    p.add_argument(
        "--data-dir", required=True, help="kit-prepare-data's shard folder, or a Megatron-LM dataset prefix"
    )
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=4, help="samples per rank per micro-batch")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument(
        "--sample-log", default="", help="append each step's sample ids here (audits the data order)"
    )
    p.add_argument("--plain", action="store_true", help="the same training with no kit call (a baseline)")
    return p.parse_known_args(argv)


def check_inputs(args: argparse.Namespace) -> str | None:
    """Why the options, the model or the data cannot be used (one line), or None: before any process group."""
    for name in ("seq_len", "batch_size", "warmup"):
        if getattr(args, name) < (0 if name == "warmup" else 1):
            return f"--{name.replace('_', '-')}={getattr(args, name)} is out of range: give a positive number"
    if not math.isfinite(args.lr) or args.lr <= 0:
        return f"--lr={args.lr} must be a finite number > 0"
    config = Path(args.model_dir) / "config.json"
    if not config.is_file():
        return f"--model-dir {args.model_dir!r} has no config.json: pass a Hugging Face model folder"
    try:
        vocab = int(json.loads(config.read_text(encoding="utf-8"))["vocab_size"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return f"{config} is not a model config with a vocab_size: pass a Hugging Face model folder"
    try:
        resilience.TokenDataset.check(
            args.data_dir, seq_len=args.seq_len, vocab_size=vocab, option="--data-dir"
        )
    except (ValueError, OSError) as exc:
        return str(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    args, kit_args = parse(sys.argv[1:] if argv is None else argv)
    try:
        cfg = resilience.load_config(kit_args)
    except resilience.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 78
    problem = check_inputs(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 78
    steps = cfg.training.steps
    try:  # the micro-batches per rank that keep the global batch on this world size (a resharded resume)
        plan = resilience.plan_batch(
            cfg, micro_batch=args.batch_size, world_size=int(os.environ.get("WORLD_SIZE", "1"))
        )
    except resilience.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 78
    if args.plain:
        return plain(args, cfg)
    cfg = plan.config  # the planned config: its checkpoints declare the global batch

    def build(job: resilience.Job, *, init_weights: bool) -> resilience.Session:
        ctx = job.ctx
        model = build_model(args.model_dir, mesh=ctx.mesh, seed=cfg.run.seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine(args.warmup, steps))
        data = resilience.TokenDataset(  # this rank's micro-batches of each global batch, seeded order
            args.data_dir,
            seq_len=args.seq_len,
            plan=plan,
            rank=ctx.rank,
            seed=cfg.run.seed,
            option="--data-dir",
        )
        state = resilience.TrainState(model=model, optimizer=optimizer, scheduler=schedule, data=data,
                                      rank=ctx.rank, data_global=True)  # fmt: skip
        return resilience.Session(job, state)

    def train(job: resilience.Job, session: resilience.Session) -> None:
        model, optimizer, data = session.model, session.optimizer, session.state.data
        while session.step < job.last_step:
            with job.step(session) as step:
                loss = torch.zeros(())
                for inputs, targets in data.step_batches():  # this rank's share of the global batch
                    part = lm_loss(model, inputs, targets) / plan.accum
                    part.backward()
                    loss += part.detach()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                with step.update():
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    session.state.scheduler.step()
                step.report(loss)
                log_samples(args.sample_log, step.number, data)  # in the block: a drain leaves at its end

    return resilience.run(cfg, build=build, train=train)


def lm_loss(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy (the targets are the inputs shifted by one token)."""
    return F.cross_entropy(model(input_ids=inputs).logits.flatten(0, 1).float(), targets.flatten())


def log_samples(path: str, step: int, data: resilience.TokenDataset) -> None:
    """This rank's global sample ids of the step, one JSON line per step (the exactly-once audit)."""
    if path:
        with open(f"{path}.rank{data.rank}", "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"step": step, "ids": data.step_samples, "pid": os.getpid()}) + "\n")


def plain(args: argparse.Namespace, cfg: resilience.ResilienceConfig) -> int:
    """The same model, data, optimizer and schedule in a loop with no kit call; step times to stdout."""
    from torch.distributed.device_mesh import init_device_mesh

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    seed, steps = cfg.run.seed, cfg.training.steps
    plan = resilience.plan_batch(cfg, micro_batch=args.batch_size, world_size=world)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    model = build_model(args.model_dir, mesh=mesh, seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine(args.warmup, steps))
    data = resilience.TokenDataset(
        args.data_dir, seq_len=args.seq_len, plan=plan, rank=rank, seed=seed, option="--data-dir"
    )
    times, losses = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = torch.zeros(())
        for inputs, targets in data.step_batches():
            part = lm_loss(model, inputs, targets) / plan.accum
            part.backward()
            loss += part.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        reduced = loss.reshape(1)
        dist.all_reduce(reduced)
        times.append(time.perf_counter() - t0)
        losses.append(float(reduced) / world)
    if rank == 0:
        print("PLAIN " + json.dumps({"step_s": times, "loss": losses}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    resilience.leave(main())  # not sys.exit: torch's C++ teardown at interpreter exit can abort (SIGABRT)
