# ruff: noqa: E501  (exact messages, one per line)
"""ENTRYPOINT and IMAGE: every rule's one line; the kit trainer's values refused with an entrypoint; what the
checks leave to the user; and the user's command through the local runner (kit launcher and torchrun)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from fsdpkit.k8s.entrypoint import Entrypoint, image_problem, parse_entrypoint
from fsdpkit.k8s.local import LocalRunner, load_job, run_local
from fsdpkit.k8s.model import ValuesError
from fsdpkit.k8s.render import render
from fsdpkit.k8s.trainer_check import check_trainer_config
from fsdpkit.k8s.values import build_values

REPO = Path(__file__).resolve().parents[2]


def _values(**overrides: str):
    return build_values(overrides={"RUN_ID": "t", **overrides}, allow_placeholders=True)


# (ENTRYPOINT, the one-line error): each rule, named by what it refuses.
BAD_ENTRYPOINTS = [
    (
        "python train.py --name 'a b",
        "ENTRYPOINT=python train.py --name 'a b: is not a command line (No closing quotation); balance the quotes, e.g. python train.py --name 'a b'",
    ),
    (
        "python train.py \\",
        "ENTRYPOINT=python train.py \\: is not a command line (No escaped character); balance the quotes",
    ),
    (
        "''",
        "ENTRYPOINT='': names no program; give a command such as python -m myproject.train, or leave ENTRYPOINT out for the kit's trainer",
    ),
    ("   ", "ENTRYPOINT=   : names no program;"),
    (
        "python t.py\x00x",
        "ENTRYPOINT=python t.py\\x00x: holds a control or invisible character (a tab, newline, NUL, ...); give the command on one line, words separated by spaces",
    ),
    ("python t.py\n--x", "ENTRYPOINT=python t.py\\n--x: holds a control or invisible character"),
    ("python t.py\tx", "ENTRYPOINT=python t.py\\tx: holds a control or invisible character"),
    (
        "python t\udcff.py",
        "ENTRYPOINT=python t\\udcff.py: holds bytes that are not UTF-8; give the command as UTF-8 text",
    ),
    (
        "--foo train.py",
        "ENTRYPOINT=--foo train.py: starts with an option (--foo); start with the program, e.g. python -m mod",
    ),
    ("-m my.train", "ENTRYPOINT=-m my.train: starts with an option (-m);"),
    (
        "$(PY) -m my.train",
        "ENTRYPOINT=$(PY) -m my.train: the program '$(PY)' holds '$(', which Kubernetes expands in a container's command; name it directly (arguments may use $(VAR) of the pod's env on purpose)",
    ),
    ("python -m $(MOD)", "ENTRYPOINT=python -m $(MOD): the module '$(MOD)' holds '$(',"),
    ("python $(RUN_DIR)/t.py", "ENTRYPOINT=python $(RUN_DIR)/t.py: the script '$(RUN_DIR)/t.py' holds '$(',"),
    ("python -m", "ENTRYPOINT=python -m: python -m needs a module name, e.g. python -m myproject.train"),
    ("python -u -m", "ENTRYPOINT=python -u -m: python -m needs a module name"),
    (
        "python -m my-project.train",
        "ENTRYPOINT=python -m my-project.train: -m my-project.train: a module name is dotted Python identifiers (letters, digits, '_'; no path, no '.py'), e.g. -m myproject.train; run a file as python path/to/train.py",
    ),
    (
        "python -m train.py",
        "ENTRYPOINT=python -m train.py: -m train.py: a module name is dotted Python identifiers",
    ),
    ("python -m src/train", "ENTRYPOINT=python -m src/train: -m src/train: a module name is dotted"),
    ("python -m .train", "ENTRYPOINT=python -m .train: -m .train: a module name is dotted"),
    (
        "python",
        "ENTRYPOINT=python: python alone starts a prompt; give -m MODULE or a script, e.g. python -m mod",
    ),
    (
        "python -c 'print(1)'",
        "ENTRYPOINT=python -c 'print(1)': python option -c is not passed on by the launcher (it starts python -u itself); drop it",
    ),
    (
        "python3 -X dev t.py",
        "ENTRYPOINT=python3 -X dev t.py: python option -X is not passed on by the launcher",
    ),
    (
        "torchrun --nproc-per-node=8 t.py",
        "ENTRYPOINT=torchrun --nproc-per-node=8 t.py: torchrun is a launcher, and the Job starts one already (LAUNCHER=kit, torchrun or ft_launcher); give only the training command, e.g. python -m myproject.train",
    ),
    (
        "python -m torch.distributed.run t.py",
        "ENTRYPOINT=python -m torch.distributed.run t.py: torch.distributed.run is a launcher",
    ),
    (
        "python -m fsdpkit.trainer --model.name small",
        "ENTRYPOINT=python -m fsdpkit.trainer --model.name small: -m fsdpkit.trainer is the kit's trainer: leave ENTRYPOINT out and set its values (MODEL=, STEPS=, TRAIN.<section>.<field>=)",
    ),
    (
        "PYTHONPATH=/fsx/code python t.py",
        "ENTRYPOINT=PYTHONPATH=/fsx/code python t.py: starts with an env assignment (PYTHONPATH=/fsx/code); set it as ENV.PYTHONPATH=... and drop it here",
    ),
]


@pytest.mark.parametrize(("entrypoint", "message"), BAD_ENTRYPOINTS, ids=[m.split(":")[1].strip()[:40] + f"[{i}]" for i, (_, m) in enumerate(BAD_ENTRYPOINTS)])  # fmt: skip
def test_k8s_each_bad_entrypoint_is_one_line(entrypoint: str, message: str) -> None:
    with pytest.raises(ValuesError) as err:
        _values(ENTRYPOINT=entrypoint)
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


GOOD_ENTRYPOINTS = [
    (
        "python -m myproject.train --cfg x",
        Entrypoint(kind="module", target="myproject.train", args=("--cfg", "x")),
    ),
    ("python3.12 -u -mmy_pkg.train", Entrypoint(kind="module", target="my_pkg.train", args=())),
    (
        "python train.py -m not.a.module",
        Entrypoint(kind="script", target="train.py", args=("-m", "not.a.module")),
    ),
    (
        "python3 ./train.py --name 'a b' \"c d\"",
        Entrypoint(kind="script", target="./train.py", args=("--name", "a b", "c d")),
    ),
    ("bash run.sh $(RUN_DIR)", Entrypoint(kind="program", target="bash", args=("run.sh", "$(RUN_DIR)"))),
    (
        "/usr/bin/python3 -X dev t.py",
        Entrypoint(kind="program", target="/usr/bin/python3", args=("-X", "dev", "t.py")),
    ),
    ("python-train --x", Entrypoint(kind="program", target="python-train", args=("--x",))),
]


@pytest.mark.parametrize(("entrypoint", "parsed"), GOOD_ENTRYPOINTS, ids=[e for e, _ in GOOD_ENTRYPOINTS])
def test_k8s_entrypoint_forms(entrypoint: str, parsed: Entrypoint) -> None:
    assert parse_entrypoint(entrypoint) == parsed
    assert _values(ENTRYPOINT=entrypoint).entrypoint == entrypoint


def test_k8s_empty_entrypoint_is_the_kit_trainer() -> None:
    assert parse_entrypoint("") is None
    assert _values(ENTRYPOINT="").entrypoint == ""


# The kit trainer's own values have no reader with an entrypoint: refused, naming what the script chooses.
KIT_TRAINER_ONLY = [
    (
        {"MODEL": "small"},
        "MODEL=small: is the kit trainer's; with ENTRYPOINT your script chooses its model: drop it, or drop ENTRYPOINT to train with the kit's trainer",
    ),
    (
        {"DATA_KIND": "shards", "DATA_PATH": "/fsx/data/c4"},
        "DATA_KIND=shards: is the kit trainer's; with ENTRYPOINT your script chooses its data",
    ),
    (
        {"DATA_PATH": "/fsx/data/c4"},
        "DATA_PATH=/fsx/data/c4: is the kit trainer's; with ENTRYPOINT your script chooses its data",
    ),
    ({"SEQ_LEN": "2048"}, "SEQ_LEN=2048: is the kit trainer's; with ENTRYPOINT your script chooses its data"),
    ({"BATCH_SIZE": "4"}, "BATCH_SIZE=4: is the kit trainer's; with ENTRYPOINT your script chooses its data"),
    (
        {"TRAIN.optim.lr": "1e-4"},
        "TRAIN.optim.lr=0.0001: is the kit trainer's; with ENTRYPOINT your script chooses its optimizer",
    ),
    (
        {"TRAIN.model.compile": "1"},
        "TRAIN.model.compile=1: is the kit trainer's; with ENTRYPOINT your script chooses its model",
    ),
    (
        {"TRAIN.data.seed": "1"},
        "TRAIN.data.seed=1: is the kit trainer's; with ENTRYPOINT your script chooses its data",
    ),
]


@pytest.mark.parametrize(
    ("extra", "message"), KIT_TRAINER_ONLY, ids=[next(iter(e)) for e, _ in KIT_TRAINER_ONLY]
)
def test_k8s_kit_trainer_values_are_refused_with_an_entrypoint(extra: dict, message: str) -> None:
    with pytest.raises(ValuesError, match="^" + re.escape(message)):
        _values(ENTRYPOINT="python -m my.train", **extra)
    if extra != {"DATA_PATH": "/fsx/data/c4"}:  # that one needs DATA_KIND=shards with the kit's trainer too
        _values(**extra)  # the same values are fine for the kit's trainer


def test_k8s_entrypoint_keeps_the_resilience_values_and_sizes_unchecked() -> None:
    """Steps, seed, checkpoints, faults and in-process restart are the resilience API's: they stay. The kit
    does not know the script's checkpoint size, so SHM_GIB and TERMINATION_GRACE_S are the user's (the
    defaults are sized as for the profile's default model); for the kit's trainer both are checked."""
    v = _values(ENTRYPOINT="python t.py", STEPS="50", SEED="1", CHECKPOINT_INTERVAL="10", INPROCESS="1",
                FAULT_SPEC="kill:step=5:rank=1", SHM_GIB="8", TERMINATION_GRACE_S="60")  # fmt: skip
    assert (v.steps, v.shm_gib, v.termination_grace_s) == (50, 8, 60)
    default = _values(ENTRYPOINT="python t.py")
    assert default.shm_gib is None  # sized like the kit trainer's default model (p5: llama3.1-8b)
    with pytest.raises(ValuesError, match=r"^SHM_GIB=8: is below the .* GiB one node stages"):
        _values(SHM_GIB="8")
    with pytest.raises(ValuesError, match=r"^TERMINATION_GRACE_S=60: is too short to drain"):
        _values(TERMINATION_GRACE_S="60")


def _config(manifests) -> str:
    (configmap,) = [m.obj for m in manifests if m.obj["kind"] == "ConfigMap"]
    return configmap["data"]["train.yaml"]


def test_k8s_trainer_check_runs_the_resilience_sections_of_an_entrypoint_config() -> None:
    """The trainer's loader checks the resilience sections in the job's world (the kit trainer's sections
    keep their defaults); the memory plan, about the kit trainer's model, is left out."""
    manifests = render(_values(ENTRYPOINT="python t.py", NODES="2", FAULT_SPEC="kill:step=5:rank=9"))
    p5 = (16, 8, 81559, 1800 * 1024)
    assert check_trainer_config(_config(manifests), memory=p5, plan=False) is None  # rank 9 of 16: fine
    assert check_trainer_config(_config(render(_values(NODES="2"))), memory=p5).startswith("memory plan: ")
    bad = render(_values(ENTRYPOINT="python t.py", STEPS="20", **{"TRAIN.training.stop_at": "50"}))
    with pytest.raises(ValuesError, match=r"^the trainer refuses this config: training\.stop_at must be in"):
        check_trainer_config(_config(bad), memory=p5, plan=False)
    with pytest.raises(
        ValuesError, match=r"^the trainer refuses this config: fault kill:step=5:rank=9 targets"
    ):
        check_trainer_config(_config(manifests), memory=(2, 2, 0, 4096), plan=False)  # the world still counts


IMAGES_OK = [
    "kit-trainer:local",
    "ubuntu",
    "library/ubuntu:24.04",
    "localhost:5000/team/train:v1",
    "123456789012.dkr.ecr.us-east-2.amazonaws.com/my-train:v1",
    "123456789012.dkr.ecr.us-east-2.amazonaws.com/team/my_train__x:2026-12-04.1",
    "ghcr.io/org/img@sha256:" + "0" * 64,
    "reg.example:443/a/b:t@sha256:" + "f" * 64,
    "PLACEHOLDER.invalid/kit-trainer:latest",  # the dry run's stand-in: registry hosts may have capitals
    "[::1]:5000/x:y",
]
IMAGES_BAD = [
    "My/Train:v1",  # the path is lower-case
    "reg.example/Train:v1",
    "reg.example/train v1",
    "reg.example/train:v1 ",
    "reg.example/train:",
    "reg.example/train:-v1",
    "reg.example/train:" + "t" * 129,
    "reg.example/train@sha256:abc",
    "reg.example/train@md5:" + "0" * 32,
    "reg.example//train",
    "reg.example/train/",
    "https://reg.example/train:v1",
    "reg.example/train:v1\n",
]


@pytest.mark.parametrize("image", IMAGES_OK)
def test_k8s_image_references_that_are_fine(image: str) -> None:
    assert image_problem(image) is None
    assert _values(IMAGE=image).image == image


@pytest.mark.parametrize("image", IMAGES_BAD)
def test_k8s_image_references_that_are_refused(image: str) -> None:
    with pytest.raises(ValuesError) as err:
        _values(IMAGE=image)
    assert str(err.value).endswith(
        ": is not an image reference [REGISTRY[:PORT]/]PATH[:TAG][@sha256:<64 hex>] (path lower-case, no "
        "spaces), e.g. 123456789012.dkr.ecr.us-east-2.amazonaws.com/my-train:v1"
    )
    assert str(err.value).startswith("IMAGE=") and "\n" not in str(err.value)


def test_k8s_image_name_length_and_tag() -> None:
    assert image_problem("r.example/" + "a" * 250) == "has a repository name of 260 characters (at most 255)"
    with pytest.raises(ValuesError, match=r"^IMAGE_TAG=v 1: a Docker tag is letters, digits"):
        _values(IMAGE_TAG="v 1")


def test_k8s_image_comes_from_the_outputs_unless_given(stack_outputs: dict) -> None:
    from fsdpkit.k8s.outputs import merge_stack_outputs

    outputs = merge_stack_outputs(stack_outputs)
    ecr = "123456789012.dkr.ecr.us-east-2.amazonaws.com/kit-trainer"
    assert build_values(outputs=outputs, overrides=["RUN_ID=t", "IMAGE_TAG=v2"]).image == f"{ecr}:v2"
    mine = "123456789012.dkr.ecr.us-east-2.amazonaws.com/my-train:v1"
    assert build_values(outputs=outputs, overrides=["RUN_ID=t", f"IMAGE={mine}"]).image == mine


# -- the local runner: the user's command as the rendered manifest has it


def _local(tmp_path: Path, *overrides: str) -> LocalRunner:
    return LocalRunner(
        load_job(render(build_values(overrides=["PROFILE=local", "RUN_ID=loc", *overrides]))),
        workdir=tmp_path,
    )


def test_k8s_local_runs_a_script_from_the_repository_root(tmp_path: Path) -> None:
    runner = _local(tmp_path, "ENTRYPOINT=python examples/hf_llama/train.py --steps 20")
    env = runner.pod_env(0, "loc-0-x")
    argv = runner.pod_argv(env)
    assert argv[0] == sys.executable and argv[1:3] == ["-m", "fsdpkit.launcher"]
    assert argv[-3:] == ["examples/hf_llama/train.py", "--steps", "20"] and "--config" not in argv
    assert env["KIT_CONFIG"] == f"{tmp_path}/configmaps/loc-config/train.yaml"


def test_k8s_local_maps_mount_paths_in_the_users_arguments(tmp_path: Path) -> None:
    runner = _local(tmp_path, "ENTRYPOINT=python -m my.train --out /fsx/runs/loc/x --cfg /etc/kit/train.yaml")
    argv = runner.pod_argv(runner.pod_env(0, "loc-0-x"))
    assert argv[-5:] == ["my.train", "--out", f"{tmp_path}/volumes/kit-local-runs/runs/loc/x", "--cfg",
                         f"{tmp_path}/configmaps/loc-config/train.yaml"]  # fmt: skip


# A user's script: reads the kit's config from $KIT_CONFIG, records what it got, exits with $EXIT_CODE.
USER_SCRIPT = """\
import json, os, pathlib, sys
import yaml
cfg = yaml.safe_load(pathlib.Path(os.environ["KIT_CONFIG"]).read_text())
out = pathlib.Path(cfg["run"]["root"]) / cfg["run"]["id"] / ("user-" + os.environ["RANK"] + ".json")
out.parent.mkdir(parents=True, exist_ok=True)
record = {"argv": sys.argv[1:], "sections": sorted(cfg), "world": os.environ["WORLD_SIZE"], "cwd": os.getcwd(),
          "module": __name__ == "__main__" and __spec__ is not None and __spec__.name}
out.write_text(json.dumps(record))
"""


@pytest.mark.timeout(120)
def test_k8s_local_runs_a_users_module_under_the_kit_launcher(tmp_path: Path) -> None:
    """2 pods x 1 process: the kit launcher starts the user's module (found through ENV.PYTHONPATH, which
    locally keeps the repository on the path as the image's /app keeps the kit) with its own arguments."""
    code = tmp_path / "code"
    (code / "userpkg").mkdir(parents=True)
    (code / "userpkg" / "__init__.py").write_text("")
    (code / "userpkg" / "train.py").write_text(USER_SCRIPT)
    manifests = render(build_values(overrides=[
        "PROFILE=local", "RUN_ID=loc", "NODES=2", "ENTRYPOINT=python -m userpkg.train --name 'a b' --steps 3",
        f"ENV.PYTHONPATH={code}", "STEPS=3",
    ]))  # fmt: skip
    result = run_local(manifests, workdir=tmp_path / "work", timeout_s=90)
    assert result.succeeded, result.reason + result.pods[0].log.read_text()[-2000:]
    records = [json.loads((result.run_dir / f"user-{rank}.json").read_text()) for rank in (0, 1)]
    for record in records:
        assert record == {"argv": ["--name", "a b", "--steps", "3"], "sections": ["checkpoint", "inprocess", "run", "training"],
                          "world": "2", "cwd": str(REPO), "module": "userpkg.train"}  # fmt: skip


@pytest.mark.timeout(120)
def test_k8s_local_torchrun_keeps_a_programs_exit_78(tmp_path: Path) -> None:
    """A program entrypoint runs inside the program wrapper: its 78 reaches the pod (FailJob, not retried),
    and a script entrypoint runs under torchrun with the user's arguments."""
    script = tmp_path / "train.py"
    script.write_text(USER_SCRIPT)
    ok = render(build_values(overrides=["PROFILE=local", "RUN_ID=loc", "NODES=1", "LAUNCHER=torchrun",
                                        f"ENTRYPOINT=python {script} --x 1"]))  # fmt: skip
    result = run_local(ok, workdir=tmp_path / "ok", timeout_s=90)
    assert result.succeeded, result.reason
    assert json.loads((result.run_dir / "user-0.json").read_text())["argv"] == ["--x", "1"]
    bad = render(build_values(overrides=["PROFILE=local", "RUN_ID=loc", "NODES=1", "LAUNCHER=torchrun",
                                         "ENTRYPOINT=sh -c 'exit 78'", "BACKOFF_LIMIT_PER_INDEX=2"]))  # fmt: skip
    result = run_local(bad, workdir=tmp_path / "bad", timeout_s=90)
    assert not result.succeeded and result.reason == "pod loc-0-local exited 78 (FailJob)", result.reason
    assert [p.exit_code for p in result.pods] == [78]
