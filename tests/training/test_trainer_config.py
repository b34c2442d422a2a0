"""Config: CLI > file > defaults, unknown keys fail listing valid ones, bad values are one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from trainer_helpers import run_cli

from fsdpkit.contracts.exitcodes import FATAL_CONFIG
from fsdpkit.trainer.config import ConfigError, TrainConfig, help_text, load_config


def _write(tmp: Path, data: dict) -> Path:
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_cli_beats_file_beats_defaults(tmp_path: Path) -> None:
    cfg_file = _write(tmp_path, {"run": {"id": "from-file"}, "optim": {"lr": 0.01, "warmup_steps": 7}})
    cfg = load_config(["--config", str(cfg_file), "--optim.lr", "3e-4", "--training.deterministic=false"])
    assert cfg.run.id == "from-file"  # file over default
    assert cfg.optim.lr == 3e-4  # CLI over file
    assert cfg.optim.warmup_steps == 7  # file
    assert cfg.optim.weight_decay == 0.1  # default
    assert cfg.training.deterministic is False
    assert cfg.checkpoint.mode == "async"  # another module's section, its own default


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (
            ["--optim.lrr", "1"],
            r"unknown config key optim\.lrr; valid keys in 'optim': optim\.lr, optim\.min_lr",
        ),
        (["--optimizer.lr", "1"], r"unknown config section .optimizer.; valid sections: run, training, "),
        (["--training.steps", "ten"], r"training\.steps must be an integer, got 'ten'"),
        (["--model.name", "huge"], r"model\.name must be one of tiny, small, llama3\.1-8b; got 'huge'"),
        (["--optim.lr", "-1"], r"optim\.lr must be > 0, got -1\.0"),
        (["--run.id", "Bad_Name"], r"run\.id must be a DNS-1123 label .* e\.g\. 'bad-name'"),
        (["--data.kind", "shards"], r"data\.path is required for data\.kind=shards"),
        (["--checkpoint.keep", "1"], r"checkpoint\.keep must be an integer >= 2"),
        (["--inprocess.max_restarts", "-2"], r"inprocess\.max_restarts must be >= 0, got -2"),
    ],
)
def test_bad_values_are_one_line_errors(argv: list[str], match: str) -> None:
    args = argv if "--run.id" in argv else ["--run.id", "ok", *argv]
    with pytest.raises(ConfigError, match=match) as info:
        load_config(args)
    assert "\n" not in str(info.value)


def test_unknown_key_in_file_fails(tmp_path: Path) -> None:
    cfg_file = _write(tmp_path, {"run": {"id": "x"}, "data": {"seq_length": 5}})
    with pytest.raises(
        ConfigError, match=r"unknown config key data\.seq_length; valid keys in 'data': data\.kind"
    ):
        load_config(["--config", str(cfg_file)])


def test_missing_shard_folder_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data\.path='.*nope' is not a folder"):
        load_config(["--run.id", "x", "--data.kind", "shards", "--data.path", str(tmp_path / "nope")])


def test_help_lists_every_field_with_its_docstring() -> None:
    text = help_text()
    for key in TrainConfig.valid_keys():
        assert f"--{key} (" in text
    assert "Peak learning rate of AdamW" in text


@pytest.mark.slow
def test_cli_exits_78_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    bad = run_cli(tmp_path, ["--run.id", "x", "--optim.warmup_steps", "-3"])
    assert bad.returncode == FATAL_CONFIG
    assert bad.stderr.strip() == "error: optim.warmup_steps must be >= 0, got -3"
    missing = run_cli(tmp_path, ["--config", str(tmp_path / "absent.yaml")])
    assert missing.returncode == FATAL_CONFIG
    assert "Traceback" not in missing.stderr and len(missing.stderr.strip().splitlines()) == 1
    assert "config file" in missing.stderr and "not found" in missing.stderr
    shown = run_cli(tmp_path, ["--help"])
    assert shown.returncode == 0 and "--inprocess.barrier_timeout_s" in shown.stdout
