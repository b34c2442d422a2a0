"""Helpers of the export tests: checkpoints written in one process with the kit's own writer, models built
from the repo's tiny configs, logits compared bitwise."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from fsdpkit.resilience.checkpoint.commit import CommitRecord, write_commit
from fsdpkit.resilience.checkpoint.layout import checkpoints_dir, step_dir
from fsdpkit.resilience.checkpoint.writer import KitStorageWriter

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[2]
HF = REPO / "tests" / "fixtures" / "hf"
TINY_LLAMA = HF / "tiny-llama"
TINY_QWEN2 = HF / "tiny-qwen2"


def save_step(run_dir: Path, step: int, model: dict[str, torch.Tensor], *, optim: bool = True) -> Path:
    """A committed 1-rank checkpoint of `model` at `step`, laid out as the kit's TrainState saves one (the
    model under train.model, AdamW-like state under train.optim, the step), with the kit's writer."""
    folder = step_dir(checkpoints_dir(run_dir), step)
    folder.mkdir(parents=True)
    tree: dict = {"train": {"model": dict(model), "step": step}}
    if optim:
        tree["train"]["optim"] = {"state": {k: {"exp_avg": torch.ones_like(v)} for k, v in model.items()}}
    writer = KitStorageWriter(folder, direct_io=False)
    dcp.save(tree, storage_writer=writer, no_dist=True)
    write_commit(folder, CommitRecord(step=step, world_size=1, files=writer.files))
    return folder


def hf_model(folder: Path, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The causal LM of `folder`'s config.json, its weights from `seed`, in eval mode (SDPA, CPU)."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
    return model.eval()


def loaded(out: Path, **kwargs: object) -> torch.nn.Module:
    """`AutoModelForCausalLM.from_pretrained(out)`, offline, in eval mode."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(out), local_files_only=True, attn_implementation="sdpa", **kwargs
    )
    return model.eval()


def tokens(vocab: int, *, seed: int = 0, shape: tuple[int, int] = (2, 48)) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The logits of a Hugging Face model (`input_ids=`) or of the kit's own Transformer (tokens)."""
    with torch.no_grad():
        if hasattr(model, "config"):
            return model(input_ids=ids).logits
        return model(ids)


def one_line(err: str) -> str:
    """The only non-blank line of `err` (no traceback)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def flip_byte(path: Path, offset: int) -> None:
    """Damage a file in place: one byte inverted (size unchanged)."""
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))
