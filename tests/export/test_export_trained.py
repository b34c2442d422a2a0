"""Models trained for real, then exported: 2 ranks (real processes, gloo) train through the public API, the
final committed checkpoint is exported with kit-export-hf (its console script's module, a process of its
own), and `from_pretrained` on the folder gives logits bitwise equal, in fp32 on CPU, to the model built
from the same checkpoint read back by DCP's own loader:
- a user's script (examples/hf_llama/train.py) on the tiny HF Llama and on a tiny Qwen2 (biases, tied
  embeddings), with the tokenizer the shards were made with;
- the kit's trainer on its own Llama (model.name tiny), loaded as LlamaForCausalLM.
And the memory bound: a ~600 MB checkpoint is exported with a resident-memory growth under 128 MB."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from export_helpers import REPO, TINY_LLAMA, TINY_QWEN2, hf_model, loaded, logits, tokens

from bench import export as bench_export
from bench.own_model import torchrun
from fsdpkit.contracts.shapes import MODEL_CONFIGS
from fsdpkit.data import prepare_data
from fsdpkit.resilience.checkpoint.compare import final_checkpoint, load_committed
from fsdpkit.trainer.model import Transformer
from tests.fixtures.tokenizers import corpus_files, train_bpe_tokenizer
from tests.training.trainer_helpers import TINY, run_trainer, trainer_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
STEPS = 6
MEMORY_CAP = 128 * 10**6
"""Resident memory the export may grow by, against a checkpoint several times larger."""


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(tokenizer folder, shard folder): a BPE of 512 trained here, the corpus tokenized with it."""
    root = tmp_path_factory.mktemp("data")
    tokenizer = train_bpe_tokenizer(root / "tok", vocab_size=512)
    prepare_data.prepare(corpus_files(), root / "shards", tokenizer=tokenizer)
    return tokenizer.parent, root / "shards"


def _train_example(tmp: Path, model: Path, shards: Path) -> Path:
    """examples/hf_llama/train.py on 2 ranks for STEPS steps; its run folder."""
    script = REPO / "examples" / "hf_llama" / "train.py"
    cmd = [*torchrun(tmp.name), str(script), "--model-dir", str(model), "--data-dir", str(shards),
           "--seq-len", "32", "--batch-size", "2", "--run.id", "run", "--run.root", str(tmp / "runs"),
           "--training.steps", str(STEPS), "--checkpoint.interval", "3"]  # fmt: skip
    env = trainer_env(tmp) | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return tmp / "runs" / "run"


def _export(tmp: Path, run: Path, out: Path, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "fsdpkit.export", str(run), str(out), *args],
        cwd=REPO, env=trainer_env(tmp), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _saved_model(run: Path) -> dict[str, torch.Tensor]:
    """The model of the run's final checkpoint, read back by DCP's own loader (fsdpkit...compare)."""
    prefix = "train/model/"
    return {
        k[len(prefix) :]: v for k, v in load_committed(final_checkpoint(run)).items() if k.startswith(prefix)
    }


@pytest.mark.parametrize("config", [TINY_LLAMA, TINY_QWEN2], ids=["llama", "qwen2"])
def test_a_users_hf_model_comes_back_with_bitwise_equal_logits(
    tmp_path: Path, data: tuple[Path, Path], config: Path
) -> None:
    tokenizer, shards = data
    run = _train_example(tmp_path, config, shards)
    out = tmp_path / "hf"
    stdout = _export(tmp_path, run, out, "--config", str(config), "--tokenizer", str(tokenizer))
    assert f"exported step {STEPS} " in stdout
    reference = hf_model(config)
    reference.load_state_dict(_saved_model(run))
    exported = loaded(out)
    ids = tokens(512, seed=1)
    assert torch.equal(logits(exported, ids), logits(reference, ids))
    assert (out / "tokenizer.json").read_bytes() == (tokenizer / "tokenizer.json").read_bytes()


def test_the_kits_own_llama_comes_back_as_llama_for_causal_lm(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    args = ["--run.id", "kit", "--run.root", str(root), *TINY, "--training.steps", str(STEPS),
            "--checkpoint.interval", "3"]  # fmt: skip
    run_trainer(tmp_path, args).check()
    out = tmp_path / "hf"
    assert "the kit's Llama tiny as LlamaForCausalLM" in _export(
        tmp_path, root / "kit", out, "--dtype", "fp32"
    )
    reference = Transformer(MODEL_CONFIGS["tiny"]).eval()
    reference.load_state_dict(_saved_model(root / "kit"))
    exported = loaded(out)
    assert type(exported).__name__ == "LlamaForCausalLM"
    ids = tokens(MODEL_CONFIGS["tiny"].vocab_size, seed=2, shape=(2, 64))
    assert torch.equal(logits(exported, ids), logits(reference, ids))


def test_a_checkpoint_several_times_the_memory_cap_exports_within_it(tmp_path: Path) -> None:
    folder = bench_export.write_random_checkpoint(tmp_path / "run", seed=5)
    size = sum(p.stat().st_size for p in folder.iterdir())
    assert size > 4 * MEMORY_CAP, size
    out = tmp_path / "hf"
    got = bench_export.measure(
        {"kind": "export", "run": str(tmp_path / "run"), "out": str(out), "dtype": "float32"}
    )
    assert got["peak_growth"] < MEMORY_CAP, got
    assert got["bytes"] == MODEL_CONFIGS["small"].num_params() * 4
    from safetensors import safe_open

    names = dict(bench_export.kit_shapes("small"))
    order = list(names)
    with safe_open(out / "model.safetensors", framework="pt") as f:
        checked = {"tok_embeddings.weight": "model.embed_tokens.weight",
                   bench_export.COLUMN_CUT: "model.layers.0.mlp.down_proj.weight"}  # fmt: skip
        for kit_name, hf_name in checked.items():
            want = bench_export.values(5, order.index(kit_name), names[kit_name])
            assert torch.equal(f.get_tensor(hf_name), want), hf_name
