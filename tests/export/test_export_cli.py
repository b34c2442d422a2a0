"""kit-export-hf end to end in one process (checkpoints written here with the kit's writer, no training): the
kit's Llama and two Hugging Face families exported and loaded with `from_pretrained`, logits bitwise equal
to the model saved; every refusal one line, exit 78 (2 for a bad command line), OUT untouched."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from export_helpers import (
    TINY_LLAMA,
    TINY_QWEN2,
    flip_byte,
    hf_model,
    loaded,
    logits,
    one_line,
    save_step,
    tokens,
)
from torch.distributed.checkpoint.state_dict import get_model_state_dict

from fsdpkit.contracts import exitcodes
from fsdpkit.contracts.shapes import MODEL_CONFIGS
from fsdpkit.export import cli
from fsdpkit.trainer.model import Transformer
from tests.fixtures.tokenizers import train_bpe_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _kit_model(seed: int) -> Transformer:
    model = Transformer(MODEL_CONFIGS["tiny"])
    model.init_weights(torch.Generator().manual_seed(seed))
    return model.eval()


@pytest.fixture(scope="module")
def kit_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, Transformer]]:
    """A run folder with the kit's tiny Llama committed at steps 4 and 8 (different weights)."""
    run = tmp_path_factory.mktemp("kit") / "run"
    models = {step: _kit_model(step) for step in (4, 8)}
    for step, model in models.items():
        save_step(run, step, model.state_dict())
    return run, models


@pytest.fixture(scope="module")
def hf_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, torch.nn.Module]]:
    """Run folders of the tiny HF Llama and the tiny Qwen2 (tied embeddings, biases), each at step 5."""
    out = {}
    for name, folder in (("llama", TINY_LLAMA), ("qwen2", TINY_QWEN2)):
        run = tmp_path_factory.mktemp(name) / "run"
        model = hf_model(folder, seed=3)
        save_step(run, 5, get_model_state_dict(model))
        out[name] = (run, model)
    return out


def _main(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_kits_llama_loads_as_llama_for_causal_lm_with_bitwise_equal_logits(
    tmp_path: Path, kit_run: tuple[Path, dict[int, Transformer]], capsys
) -> None:
    run, models = kit_run
    code, out, err = _main(capsys, run, tmp_path / "out")
    assert code == exitcodes.OK, err
    assert "exported step 8 (the kit's Llama tiny as LlamaForCausalLM)" in out
    model = loaded(tmp_path / "out")
    assert type(model).__name__ == "LlamaForCausalLM"
    ids = tokens(MODEL_CONFIGS["tiny"].vocab_size)
    assert torch.equal(logits(model, ids), logits(models[8], ids))
    code, _, err = _main(capsys, run, tmp_path / "step4", "--step", 4, "--model", "tiny")
    assert code == exitcodes.OK, err
    assert torch.equal(logits(loaded(tmp_path / "step4"), ids), logits(models[4], ids))
    for given, step in ((run / "checkpoints", 8), (run / "checkpoints" / "step_00000004", 4)):
        code, out, err = _main(capsys, given, tmp_path / given.name)  # a hurried user's other folders
        assert code == exitcodes.OK and f"exported step {step} " in out, err


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_hugging_face_models_export_with_their_config_and_tokenizer(
    tmp_path: Path, hf_runs: dict[str, tuple[Path, torch.nn.Module]], family: str, capsys
) -> None:
    run, model = hf_runs[family]
    config = TINY_LLAMA if family == "llama" else TINY_QWEN2
    tokenizer = train_bpe_tokenizer(tmp_path / "tok", vocab_size=512)
    code, out, err = _main(capsys, run, tmp_path / "out", "--config", config, "--tokenizer", tokenizer.parent)
    assert code == exitcodes.OK, err
    assert f"({type(model).__name__} of {config})" in out
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == tokenizer.read_bytes()
    exported = loaded(tmp_path / "out")
    ids = tokens(512)
    assert torch.equal(logits(exported, ids), logits(model, ids))
    header = json.loads((tmp_path / "out" / "config.json").read_text())
    assert header["dtype"] == header["torch_dtype"] == "float32"
    if family == "qwen2":  # tied: one matrix in the file, as save_pretrained writes it; tied again on load
        from safetensors import safe_open

        with safe_open(tmp_path / "out" / "model.safetensors", framework="pt") as f:
            assert set(f.keys()) >= {"model.embed_tokens.weight"} and "lm_head.weight" not in set(f.keys())
        assert exported.lm_head.weight.data_ptr() == exported.model.embed_tokens.weight.data_ptr()


def test_bfloat16_shards_load_and_compute_as_the_model_cast_to_bfloat16(
    tmp_path: Path, hf_runs: dict[str, tuple[Path, torch.nn.Module]], capsys
) -> None:
    run, model = hf_runs["llama"]
    code, _, err = _main(
        capsys, run, tmp_path / "out", "--config", TINY_LLAMA, "--dtype", "bf16", "--max-shard-size", "40KB"
    )
    assert code == exitcodes.OK, err
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 3 and files == sorted(p.name for p in (tmp_path / "out").glob("model-*.safetensors"))
    exported = loaded(tmp_path / "out")
    assert exported.dtype == torch.bfloat16
    reference = hf_model(TINY_LLAMA, dtype=torch.bfloat16)
    reference.load_state_dict({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
    ids = tokens(512)
    assert torch.equal(logits(exported, ids), logits(reference, ids))


def test_a_damaged_newest_step_falls_back_and_one_asked_for_is_refused(
    tmp_path: Path, kit_run: tuple[Path, dict[int, Transformer]], capsys
) -> None:
    run = tmp_path / "run"
    shutil.copytree(kit_run[0], run)
    flip_byte(run / "checkpoints" / "step_00000008" / "__0_0.distcp", 5000)
    code, out, err = _main(capsys, run, tmp_path / "out")
    assert code == exitcodes.OK, err
    warning = one_line(err)
    assert warning.startswith("warning: step 8 skipped: it does not verify (__0_0.distcp: crc32c ")
    assert "exported step 4 " in out
    code, _, err = _main(capsys, run, tmp_path / "out8", "--step", 8)
    assert code == exitcodes.FATAL_CONFIG
    line = one_line(err)
    assert "step 8 in " in line and "does not verify: __0_0.distcp: crc32c " in line and "!= recorded" in line
    assert "(committed: 4)" in line and not (tmp_path / "out8").exists()
    flip_byte(run / "checkpoints" / "step_00000004" / "__0_0.distcp", 100)
    code, _, err = _main(capsys, run, tmp_path / "none")
    assert code == exitcodes.FATAL_CONFIG
    assert "2 committed checkpoint(s) in " in err and "but none verifies (step 8: __0_0.distcp" in err


def test_force_replaces_the_old_weights_and_keeps_other_files(
    tmp_path: Path, kit_run: tuple[Path, dict[int, Transformer]], capsys
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "model-00001-of-00009.safetensors").write_text("stale")
    code, _, err = _main(capsys, kit_run[0], out)
    assert code == exitcodes.FATAL_CONFIG
    assert "exists and is not empty: pick a new or empty folder, or pass --force" in one_line(err)
    code, _, err = _main(capsys, kit_run[0], out, "--force")
    assert code == exitcodes.OK, err
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "notes.txt"]
    assert not list(tmp_path.glob(".out.export-*"))  # the staging folder is gone


def test_values_that_cannot_be_exported_are_refused_by_name(tmp_path: Path, capsys) -> None:
    model = _kit_model(1).state_dict()
    model["layers.2.ffn_norm.weight"][7] = float("nan")
    save_step(tmp_path / "nan", 6, model)
    code, _, err = _main(capsys, tmp_path / "nan", tmp_path / "out")
    assert code == exitcodes.FATAL_CONFIG
    assert "layers.2.ffn_norm.weight holds NaN or inf values: the run had diverged by step 6" in one_line(err)
    big = _kit_model(1).state_dict()
    big["norm.weight"][0] = 1e6
    save_step(tmp_path / "big", 6, big)
    code, _, err = _main(capsys, tmp_path / "big", tmp_path / "out", "--dtype", "float16")
    assert code == exitcodes.FATAL_CONFIG
    assert "norm.weight has values beyond torch.float16's range (+-65504)" in one_line(err)
    assert not (tmp_path / "out").exists()


def _bad_config(tmp: Path) -> Path:
    folder = tmp / "narrow"
    folder.mkdir()
    config = json.loads((TINY_LLAMA / "config.json").read_text()) | {"hidden_size": 32, "head_dim": 8}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _latin1_config(tmp: Path) -> Path:
    folder = tmp / "latin1"
    folder.mkdir()
    (folder / "config.json").write_bytes(
        (TINY_LLAMA / "config.json").read_bytes().replace(b"silu", b"s\xe9lu")
    )
    return folder


def _file(tmp: Path, name: str) -> Path:
    (tmp / name).write_text("x")
    return tmp / name


def _tokenizer(tmp: Path, vocab: int) -> Path:
    return train_bpe_tokenizer(tmp / f"tok{vocab}", vocab_size=vocab).parent


def _no_commit(tmp: Path) -> Path:
    (tmp / "half" / "checkpoints" / "step_00000003").mkdir(parents=True)
    return tmp / "half"


REFUSALS = [  # (argv after RUN OUT, or a run of its own; exit; a fragment of the one line)
    (lambda t, k, h: [t / "nowhere", t / "o"], 78, "does not exist: give <run.root>/<run.id>"),
    (lambda t, k, h: [_file(t, "run.txt"), t / "o"], 78, "is a file: give the run folder holding"),
    (lambda t, k, h: [t, t / "o"], 78, "has no checkpoints/ folder"),
    (lambda t, k, h: [_no_commit(t), t / "o"], 78, "(1 step folder(s) without commit.json: their"),
    (lambda t, k, h: [k, t / "o", "--step", 5], 78, "step 5 is not in "),
    (lambda t, k, h: [k / "checkpoints" / "step_00000004", t / "o", "--step", 8], 78, "is step 4 but"),
    (lambda t, k, h: [k, _file(t, "o")], 78, "OUT "),
    (lambda t, k, h: [k, _file(t, "f") / "o"], 78, "is a file, so"),
    (lambda t, k, h: [k, k / "checkpoints" / "hf"], 78, "whose old steps the run deletes"),
    (lambda t, k, h: [h, t / "o"], 78, "pass --config MODEL_DIR, the Hugging Face folder the run trained"),
    (lambda t, k, h: [h, t / "o", "--config", _bad_config(t)], 78,
     "does not match "),
    (lambda t, k, h: [h, t / "o", "--config", _latin1_config(t)], 78, "config.json is not UTF-8 text"),
    (lambda t, k, h: [h, t / "o", "--config", _file(t, "config.json")], 78, "is a file: give the folder"),
    (lambda t, k, h: [k, t / "o", "--config", TINY_LLAMA], 78, "holds the kit's own Llama (tok_embeddings"),
    (lambda t, k, h: [k, t / "o", "--model", "small"], 78, "does not match the kit's Llama small ("),
    (lambda t, k, h: [k, t / "o", "--model", "huge"], 2, "argument --model: invalid choice: 'huge'"),
    (lambda t, k, h: [h, t / "o", "--model", "tiny"], 78, "--model tiny names a shape of the kit's own"),
    (lambda t, k, h: [k, t / "o", "--tokenizer", _file(t, "tokenizer.json")], 78, "--tokenizer "),
    (lambda t, k, h: [k, t / "o", "--tokenizer", t], 78, "holds no tokenizer files (tokenizer.json"),
    (lambda t, k, h: [h, t / "o", "--config", TINY_LLAMA, "--tokenizer", _tokenizer(t, 600)], 78,
     "tokenizer.json: the tokenizer has 600 tokens but the model's vocab_size is 512"),
    (lambda t, k, h: [k, t / "o", "--dtype", "fp8"], 2, "argument --dtype: 'fp8': one of float32, bfloat16"),
    (lambda t, k, h: [k, t / "o", "--step", "nan"], 2, "argument --step: 'nan': not a whole number"),
    (lambda t, k, h: [k, t / "o", "--step", "-1"], 2, "argument --step: '-1': must be at least 0"),
    (lambda t, k, h: [k, t / "o", "--step", "1.5"], 2, "argument --step: '1.5': not a whole number"),
    (lambda t, k, h: [k, t / "o", "--max-shard-size", "0"], 2, "a size must be a finite number above 0"),
    (lambda t, k, h: [k, t / "o", "--max-shard-size=-5GB"], 2, "'-5GB': a size must be a finite"),
    (lambda t, k, h: [k, t / "o", "--max-shard-size", "nanGB"], 2, "'nanGB': a size such as 5GB"),
    (lambda t, k, h: [k, t / "o", "--max-shard-size", "5XB"], 2, "a size such as 5GB, 500MB, 2GiB"),
    (lambda t, k, h: [k, t / "o", "--config", TINY_LLAMA, "--model", "tiny"], 2, "not allowed with argument"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "code", "fragment"), REFUSALS, ids=[f for _, _, f in REFUSALS])
def test_refusals_are_one_line_and_leave_out_untouched(
    tmp_path: Path,
    kit_run: tuple[Path, dict[int, Transformer]],
    hf_runs: dict[str, tuple[Path, torch.nn.Module]],
    argv,
    code: int,
    fragment: str,
    capsys,
) -> None:
    args = argv(tmp_path, kit_run[0], hf_runs["llama"][0])
    with pytest.raises(SystemExit) if code == 2 else _nothing() as raised:
        got = cli.main([str(a) for a in args])
    got = raised.value.code if code == 2 else got
    err = capsys.readouterr().err
    assert got == code, err
    line = one_line(err)
    assert line.startswith(("error: ", "python -m fsdpkit.export: error: ")) and fragment in line, line
    assert not (tmp_path / "o").is_dir()
    assert not list(tmp_path.glob(".o.export-*"))


class _nothing:
    """A context that raises nothing (the exit-78 refusals return their code)."""

    value = None

    def __enter__(self) -> _nothing:
        return self

    def __exit__(self, *exc: object) -> None:
        return None
