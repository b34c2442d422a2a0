"""The render-time trainer config check: `python -m fsdpkit.trainer.check_config` runs the trainer's own
loader on the rendered train.yaml (no process group, no model), and k8s turns its exit 78 into one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fsdpkit.contracts.ports import free_port_run
from fsdpkit.k8s.model import ValuesError
from fsdpkit.k8s.render import render
from fsdpkit.k8s.spec import CONFIG_FILE
from fsdpkit.k8s.trainer_check import check_trainer_config
from fsdpkit.k8s.values import build_values

REPO = Path(__file__).resolve().parents[2]


def _config(*overrides: str) -> str:
    manifests = render(build_values(overrides=["PROFILE=local", "RUN_ID=chk", *overrides]))
    (configmap,) = [m.obj for m in manifests if m.obj["kind"] == "ConfigMap"]
    return configmap["data"][CONFIG_FILE]


def _check_config(
    tmp_path: Path, config: str, *flags: str, env: dict | None = None
) -> subprocess.CompletedProcess:
    path = tmp_path / "train.yaml"
    path.write_text(config)
    return subprocess.run(
        [sys.executable, "-m", "fsdpkit.trainer.check_config", *flags, "--config", str(path)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )  # fmt: skip


def test_check_config_accepts_a_good_config_without_a_process_group(tmp_path: Path) -> None:
    """Env that would make a process group wait for a rank 1 that never comes: the check must not care."""
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port_run())}
    proc = _check_config(tmp_path, _config("TRAIN.optim.beta1=0.8"), "--elsewhere", env=env)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_the_check_does_not_import_torch(tmp_path: Path) -> None:
    """Every render runs it: torch's import would add ~3 s of CPU to each `make train-job` and `k8s local`."""
    path = tmp_path / "train.yaml"
    path.write_text(_config())
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['check_config', '--elsewhere', '--config', {str(path)!r}]\n"
        "try:\n"
        "    runpy.run_module('fsdpkit.trainer.check_config', run_name='__main__')\n"
        "finally:\n"
        "    print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "[]\n", "")


def test_check_config_refuses_with_the_trainers_message_and_78(tmp_path: Path) -> None:
    proc = _check_config(tmp_path, _config("TRAIN.optim.lr=abc"), "--elsewhere")
    assert (proc.returncode, proc.stdout) == (78, "")
    assert proc.stderr == "error: optim.lr='abc': not a number; pass a number\n"


def test_check_config_elsewhere_leaves_the_pods_machine_checks_to_the_pod(tmp_path: Path) -> None:
    """A shard folder on the pod's FSx does not exist here: with --elsewhere that is not an error (the
    trainer checks it where it runs); without, the trainer's own host check refuses it."""
    config = _config("DATA_KIND=shards", "DATA_PATH=/fsx/data/c4")
    assert yaml.safe_load(config)["data"] == {"kind": "shards", "path": "/fsx/data/c4"}
    assert _check_config(tmp_path, config, "--elsewhere").returncode == 0
    here = _check_config(tmp_path, config)
    assert here.returncode == 78 and here.stderr.startswith("error: data.path='/fsx/data/c4' is not a folder")


def test_k8s_trainer_check_turns_78_into_one_values_error() -> None:
    check_trainer_config(_config("TRAIN.optim.warmup_steps=5"))
    with pytest.raises(ValuesError) as err:
        check_trainer_config(_config("TRAIN.optim.bogus=1"))
    assert str(err.value).startswith(
        "the trainer refuses this config: unknown config key optim.bogus; valid keys in 'optim': optim.lr,"
    )
    assert "\n" not in str(err.value)


def test_k8s_trainer_check_that_cannot_run_is_an_error(tmp_path: Path) -> None:
    """A missing interpreter or trainer is a one-line error, never a silent pass."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named torch' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(
        ValuesError, match=r"^the trainer's config check could not run \(exit 1: ModuleNotFound"
    ):
        check_trainer_config(_config(), python=str(fake))


def _p5_config(*overrides: str) -> str:
    manifests = render(build_values(overrides=["RUN_ID=mem", "NODES=2", *overrides], allow_placeholders=True))
    (configmap,) = [m.obj for m in manifests if m.obj["kind"] == "ConfigMap"]
    return configmap["data"][CONFIG_FILE]


P5_MEMORY = (16, 8, 81559, 1800 * 1024)
"""2 p5 nodes: world 16, 8 ranks per node, H100 80 GB, the pod's 1800 GiB."""


def test_p5_default_job_fits_by_the_memory_plan() -> None:
    line = check_trainer_config(_p5_config(), memory=P5_MEMORY)
    assert line.startswith("memory plan: ") and "activation_checkpointing=full" in line
    used, of = (float(x) for x in line.removeprefix("memory plan: ").split(" GiB")[0].split(" of "))
    assert used < of


def test_p5_job_without_activation_checkpointing_is_refused_at_render() -> None:
    with pytest.raises(
        ValuesError, match=r"the job needs .* per GPU .*use model.activation_checkpointing="
    ) as exc:
        check_trainer_config(_p5_config("TRAIN.model.activation_checkpointing=none"), memory=P5_MEMORY)
    assert "\n" not in str(exc.value)


def test_k8s_trainer_fields_are_trainer_config_fields() -> None:
    """k8s keeps its own list (it does not import the trainer): every name in it must exist there."""
    from fsdpkit.k8s.model import TRAINER_FIELDS
    from fsdpkit.trainer.config import TrainConfig

    known = TrainConfig.sections()
    for section, names in TRAINER_FIELDS.items():
        fields = set(known[section].__dataclass_fields__)
        assert set(names) <= fields, (section, set(names) - fields)


def test_the_check_sees_the_jobs_world_size() -> None:
    """A fault on rank 1 is valid for 2 local ranks, refused for 1, as the trainer in the pod would decide."""
    config = _config("FAULT_SPEC=kill:step=5:rank=1", "PROCS_PER_NODE=2")
    check_trainer_config(config, memory=(2, 2, 0, 4096))
    with pytest.raises(ValueError, match="targets rank 1 but the world size is 1"):
        check_trainer_config(config, memory=(1, 1, 0, 4096))


def test_check_config_refuses_bad_auto_interval_bounds_in_one_line(tmp_path: Path) -> None:
    config = _config("CHECKPOINT_INTERVAL=auto", "TRAIN.checkpoint.interval_min=0")
    proc = _check_config(tmp_path, config, "--elsewhere")
    assert (proc.returncode, proc.stdout) == (78, "")
    message = "checkpoint.interval_min must be an integer in [1, 16777216] (steps), got 0"
    assert proc.stderr == f"error: {message}\n"
