"""Train a Hugging Face causal LM on your own tokenized data with the kit's resilience API.

    python examples/hf_llama/train.py --model-dir MODEL --data-dir SHARDS [--steps N ...] [--run.id ID ...]

MODEL is a local folder with a `config.json` (e.g. a Llama config; with `model.safetensors` the weights are
loaded, else initialised from the seed); SHARDS is the folder `python -m fsdpkit.trainer.prepare_data` wrote
from your text with your `tokenizer.json`. Options after the script's own (`--section.field VALUE`) and the
Job's config file (`$KIT_CONFIG`) set the kit's sections: run, training, checkpoint, fault, inprocess,
straggler. `--plain` runs the same model, data and optimizer in a plain loop with no kit call (the benchmark's
baseline: no checkpoints, no faults, no restarts).

Everything this script needs from the kit is `from training import resilience`; the rest is PyTorch and
`transformers`. Copy it and change the model, the data and the loop; keep the three rules that make a
resume bitwise equal to a run without faults (docs/own-model.md): every value that changes during
training is in the TrainState (model, optimizer, schedule, data position, RNG), the data a step reads
depends only on the data position, and the optimizer step sits inside `step.update()`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder only: never a model hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the kit, when run from a checkout

from fsdpkit import resilience

SHARD_HEADER = 32
"""The token shard header (magic, item size, vocab size, token count; training/trainer/data.py documents
it)."""


def read_header(path: Path) -> tuple[np.dtype, int, int]:
    """(token dtype, vocab size, token count) of one shard, from its 32-byte header alone."""
    with open(path, "rb") as fh:
        head = fh.read(SHARD_HEADER)
    if len(head) < SHARD_HEADER or head[:8] != b"KITTOK01":
        raise ValueError(
            f"{path} is not a token shard: prepare it with python -m fsdpkit.trainer.prepare_data"
        )
    itemsize = int.from_bytes(head[8:12], "little")
    dtype = np.dtype("<u2") if itemsize == 2 else np.dtype("<u4")
    return dtype, int.from_bytes(head[12:16], "little"), int.from_bytes(head[16:24], "little")


class ShardData:
    """Windows of seq_len + 1 tokens from the shards, in a seeded order; Stateful: the global sample cursor.

    Rank r of W reads global samples cursor + r*B ... cursor + (r+1)*B - 1, then the cursor moves by W*B:
    the same on every rank, so the TrainState saves it once. A sample is a pure function of its index:
    epoch e visits window (a*j + b) mod n for j = 0..n-1, with a (coprime to n) and b drawn from (seed, e),
    so nothing of the order is held in memory and the shards stay memory-mapped, never loaded."""

    def __init__(self, folder: str, *, seq_len: int, batch: int, seed: int, rank: int, world: int) -> None:
        self.seq_len, self.batch, self.seed, self.rank, self.world = seq_len, batch, seed, rank, world
        self.maps = []
        for path in sorted(Path(folder).glob("*.bin")):
            dtype, _, count = read_header(path)
            self.maps.append(np.memmap(path, dtype=dtype, mode="r", offset=SHARD_HEADER, shape=(count,)))
        self.starts = np.cumsum([0] + [m.size for m in self.maps])
        self.windows = int(self.starts[-1]) // (seq_len + 1)
        self.cursor = 0
        self.last_ids: list[int] = []
        self._epoch: tuple[int, int, int] | None = None

    def window(self, index: int) -> int:
        """Sample `index` -> its window under the epoch's seeded affine order."""
        epoch, j = divmod(index, self.windows)
        if self._epoch is None or self._epoch[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            a = int(rng.integers(1, max(2, self.windows)))
            while math.gcd(a, self.windows) != 1:
                a = a % self.windows + 1
            self._epoch = (epoch, a, int(rng.integers(0, self.windows)))
        _, a, b = self._epoch
        return (a * j + b) % self.windows

    def tokens(self, start: int, length: int) -> np.ndarray:
        """`length` tokens of the concatenated shards from `start` (a window may span two shards)."""
        out = np.empty(length, dtype=np.int64)
        filled = 0
        while filled < length:
            i = int(np.searchsorted(self.starts, start + filled, side="right")) - 1
            local = start + filled - int(self.starts[i])
            take = min(length - filled, self.maps[i].size - local)
            out[filled : filled + take] = self.maps[i][local : local + take]
            filled += take
        return out

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        first = self.cursor + self.rank * self.batch
        self.last_ids = [first + i for i in range(self.batch)]
        width = self.seq_len + 1
        batch = torch.from_numpy(
            np.stack([self.tokens(self.window(i) * width, width) for i in self.last_ids])
        )
        self.cursor += self.world * self.batch
        return batch[:, :-1], batch[:, 1:]

    def state_dict(self) -> dict[str, int]:
        return {"cursor": self.cursor}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.cursor = int(state["cursor"])


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
        "--data-dir", required=True, help="token shards from python -m fsdpkit.trainer.prepare_data"
    )
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=4, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument(
        "--sample-log", default="", help="append each step's sample ids here (audits the data order)"
    )
    p.add_argument("--plain", action="store_true", help="the same training with no kit call (a baseline)")
    return p.parse_known_args(argv)


def check_inputs(args: argparse.Namespace) -> str | None:
    """Why the model or data folder cannot be used (one line), or None: before any process group."""
    config = Path(args.model_dir) / "config.json"
    if not config.is_file():
        return f"--model-dir {args.model_dir!r} has no config.json: pass a Hugging Face model folder"
    try:
        vocab = int(json.loads(config.read_text(encoding="utf-8"))["vocab_size"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return f"{config} is not a model config with a vocab_size: pass a Hugging Face model folder"
    shards = sorted(Path(args.data_dir).glob("*.bin")) if Path(args.data_dir).is_dir() else []
    if not shards:
        return (
            f"--data-dir {args.data_dir!r} holds no *.bin shards: run python -m fsdpkit.trainer.prepare_data"
        )
    for shard in shards:
        head = shard.read_bytes()[:SHARD_HEADER]
        if head[:8] != b"KITTOK01" or int.from_bytes(head[12:16], "little") > vocab:
            return (
                f"{shard} is not a token shard for a vocab of {vocab}: prepare it with the model's tokenizer"
            )
    for name in ("seq_len", "batch_size", "warmup"):
        if getattr(args, name) < (0 if name == "warmup" else 1):
            return f"--{name.replace('_', '-')}={getattr(args, name)} is out of range: give a positive number"
    if not math.isfinite(args.lr) or args.lr <= 0:
        return f"--lr={args.lr} must be a finite number > 0"
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
    if args.plain:
        return plain(args, seed=cfg.run.seed, steps=cfg.training.steps)
    steps = cfg.training.steps
    try:  # the micro-batches per rank that keep the global batch on this world size (a resharded resume)
        plan = resilience.plan_batch(
            cfg, micro_batch=args.batch_size, world_size=int(os.environ.get("WORLD_SIZE", "1"))
        )
    except resilience.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 78
    cfg, accum = plan.config, plan.accum  # the planned config: its checkpoints declare the global batch

    def build(job: resilience.Job, *, init_weights: bool) -> resilience.Session:
        ctx = job.ctx
        model = build_model(args.model_dir, mesh=ctx.mesh, seed=cfg.run.seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine(args.warmup, steps))
        data = ShardData(args.data_dir, seq_len=args.seq_len, batch=args.batch_size, seed=cfg.run.seed,
                         rank=ctx.rank, world=ctx.world_size)  # fmt: skip
        state = resilience.TrainState(model=model, optimizer=optimizer, scheduler=schedule, data=data,
                                      rank=ctx.rank, data_global=True)  # fmt: skip
        return resilience.Session(job, state)

    def train(job: resilience.Job, session: resilience.Session) -> None:
        model, optimizer, data = session.model, session.optimizer, session.state.data
        while session.step < job.last_step:
            with job.step(session) as step:
                loss = torch.zeros(())
                for _ in range(accum):  # each micro-batch's share of the mean over the global batch
                    inputs, targets = data.next_batch()
                    part = (
                        F.cross_entropy(
                            model(input_ids=inputs).logits.flatten(0, 1).float(), targets.flatten()
                        )
                        / accum
                    )
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


def log_samples(path: str, step: int, data: ShardData) -> None:
    if path:
        with open(f"{path}.rank{data.rank}", "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"step": step, "ids": data.last_ids, "pid": os.getpid()}) + "\n")


def plain(args: argparse.Namespace, *, seed: int, steps: int) -> int:
    """The same model, data, optimizer and schedule in a loop with no kit call; step times to stdout."""
    from torch.distributed.device_mesh import init_device_mesh

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    model = build_model(args.model_dir, mesh=mesh, seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine(args.warmup, steps))
    data = ShardData(
        args.data_dir, seq_len=args.seq_len, batch=args.batch_size, seed=seed, rank=rank, world=world
    )
    times, losses = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        inputs, targets = data.next_batch()
        loss = F.cross_entropy(model(input_ids=inputs).logits.flatten(0, 1).float(), targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        reduced = loss.detach().reshape(1)
        dist.all_reduce(reduced)
        times.append(time.perf_counter() - t0)
        losses.append(float(reduced) / world)
    if rank == 0:
        print("PLAIN " + json.dumps({"step_s": times, "loss": losses}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    resilience.leave(main())  # not sys.exit: torch's C++ teardown at interpreter exit can abort (SIGABRT)
