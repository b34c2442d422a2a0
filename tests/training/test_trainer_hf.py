"""The kit's trainer on a Hugging Face model folder (`model.hf_path`) and the user's tokenized data: bad
input is one line before any process group, and one process trains the 2-layer HF Llama on the repo's
corpus (the loss falls). The multi-process proofs under faults run the example script
(tests/k8s/test_k8s_own_model.py), which goes through the same public API."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
import torch.distributed as dist

from fsdpkit.contracts import exitcodes
from fsdpkit.data import prepare_data
from fsdpkit.runtime.events import read_events
from fsdpkit.trainer import train
from tests.fixtures.tokenizers import corpus_files, train_bpe_tokenizer

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "fixtures" / "hf" / "tiny-llama"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(tokenizer.json, shard folder): a BPE of 512 trained here, the stored corpus tokenized with it."""
    root = tmp_path_factory.mktemp("corpus")
    tokenizer = train_bpe_tokenizer(root / "tok", vocab_size=512)
    shards = root / "shards"
    prepare_data.prepare(corpus_files(), shards, tokenizer=tokenizer)
    return tokenizer, shards


def _model(tmp: Path, name: str, *, tokenizer: Path | None = None, **config: object) -> Path:
    folder = tmp / name
    folder.mkdir()
    cfg = json.loads((TINY / "config.json").read_text()) | config
    (folder / "config.json").write_text(json.dumps(cfg))
    if tokenizer is not None:
        shutil.copy(tokenizer, folder / "tokenizer.json")
    return folder


def _args(tmp: Path, model: Path, shards: Path, *more: str) -> list[str]:
    return ["--run.id", "hf", "--run.root", str(tmp / "runs"), "--model.hf_path", str(model),
            "--data.kind", "shards", "--data.path", str(shards), "--data.seq_len", "64", *more]  # fmt: skip


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.filterwarnings("ignore:Unable to enable fault handler")
def test_bad_model_folders_tokenizers_shards_and_weights_are_one_line_before_any_group(
    tmp_path: Path, corpus: tuple[Path, Path], capsys
) -> None:
    tokenizer, shards = corpus
    other = train_bpe_tokenizer(tmp_path / "other", vocab_size=400)
    bigger = train_bpe_tokenizer(tmp_path / "bigger", vocab_size=600)
    (tmp_path / "noconfig").mkdir()
    wrong = _model(tmp_path, "wrong", tokenizer=tokenizer)
    from safetensors.torch import save_file
    from torch import zeros

    save_file({"model.embed_tokens.weight": zeros(512, 32)}, wrong / "model.safetensors")
    cases = [
        (
            tmp_path / "noconfig",
            "config.json does not exist: a Hugging Face model folder has its config.json",
        ),
        (_model(tmp_path, "bigvocab", tokenizer=bigger), "but the model's vocab_size is 512"),
        (_model(tmp_path, "othertok", tokenizer=other), "were made with another tokenizer (fingerprint"),
        (wrong, "do not match config.json"),
    ]
    for folder, message in cases:
        code = train.main(_args(tmp_path, folder, shards, "--training.steps", "4"))
        assert code == exitcodes.FATAL_CONFIG, folder
        assert message in _one_line(capsys.readouterr().err), folder
        assert not dist.is_initialized() and not (tmp_path / "runs").exists()


@pytest.mark.filterwarnings("ignore:Unable to enable fault handler")
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_the_kit_trainer_trains_an_hf_model_on_real_text(tmp_path: Path, corpus: tuple[Path, Path]) -> None:
    tokenizer, shards = corpus
    model = _model(tmp_path, "tiny", tokenizer=tokenizer)
    more = ["--training.steps", "16", "--optim.lr", "3e-3", "--optim.warmup_steps", "2", "--checkpoint.mode",
            "sync", "--checkpoint.interval", "8"]  # fmt: skip
    previous = signal.getsignal(signal.SIGTERM)  # the drain handler must not outlive this test's worker
    try:
        assert train.main(_args(tmp_path, model, shards, *more)) == exitcodes.OK
    finally:
        signal.signal(signal.SIGTERM, previous)
    losses = [e["loss"] for e in read_events(tmp_path / "runs" / "hf") if e["kind"] == "step"]
    assert len(losses) == 16 and losses[-1] < losses[0] - 0.3, losses
    start = next(e for e in read_events(tmp_path / "runs" / "hf") if e["kind"] == "start")
    assert (start["model"], start["hf_path"]) == ("hf", str(model))
