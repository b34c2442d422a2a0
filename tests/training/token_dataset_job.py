"""A user's script on the public API alone whose data is `resilience.TokenDataset`: a tiny model sharded with
FSDP2 (an embedding and a linear head) on token shards, each step this rank's micro-batches of the global
batch. Every step appends to LOG.rank<R> one JSON line: the step, the world size, the global sample ids the
rank read (`step_samples`) and a CRC32 of each sample's tokens, so a test can prove every sample was read
exactly once, with the right tokens, across restarts and world sizes (test_token_dataset_resume.py).

    python tests/training/token_dataset_job.py DATA LOG [--section.field VALUE ...]
"""

from __future__ import annotations

import json
import os
import sys
import zlib

import torch
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

from fsdpkit import resilience

SEQ_LEN = 16
MICRO_BATCH = 2
VOCAB = 257
"""The byte tokenizer's (kit-make-shards)."""


def crc(inputs: torch.Tensor, targets: torch.Tensor) -> list[int]:
    """CRC32 of each sample's seq_len + 1 tokens, rebuilt from its inputs and shifted targets."""
    rows = torch.cat([inputs, targets[:, -1:]], dim=1)
    return [zlib.crc32(row.numpy().tobytes()) for row in rows]


def main() -> int:
    data_path, log = sys.argv[1], sys.argv[2]
    cfg = resilience.load_config(sys.argv[3:])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    plan = resilience.plan_batch(cfg, micro_batch=MICRO_BATCH, world_size=world)

    def build(job: resilience.Job, *, init_weights: bool) -> resilience.Session:
        model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, VOCAB))
        fully_shard(model, mesh=job.ctx.mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        data = resilience.TokenDataset(
            data_path, seq_len=SEQ_LEN, plan=plan, rank=job.ctx.rank, seed=plan.config.run.seed,
            vocab_size=VOCAB,
        )  # fmt: skip
        state = resilience.TrainState(
            model=model, optimizer=optimizer, data=data, rank=job.ctx.rank, data_global=True
        )
        return resilience.Session(job, state)

    def train(job: resilience.Job, session: resilience.Session) -> None:
        data = session.state.data
        while session.step < job.last_step:
            with job.step(session) as step:
                loss, crcs = torch.zeros(()), []
                for inputs, targets in data.step_batches():
                    logits = session.model(inputs)
                    part = F.cross_entropy(logits.flatten(0, 1), targets.flatten()) / plan.accum
                    part.backward()
                    loss += part.detach()
                    crcs += crc(inputs, targets)
                with step.update():
                    session.optimizer.step()
                    session.optimizer.zero_grad(set_to_none=True)
                step.report(loss)
                record = {
                    "step": step.number,
                    "world": job.ctx.world_size,
                    "ids": data.step_samples,
                    "crc": crcs,
                }
                with open(f"{log}.rank{job.ctx.rank}", "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(record) + "\n")

    return resilience.run(plan.config, build=build, train=train)


if __name__ == "__main__":
    resilience.leave(main())
