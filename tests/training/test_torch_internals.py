"""The one module that touches torch's private names (training/runtime/torch_internals.py): every name it
lists exists on this torch, and a torch without one of them, or older than the tested range, is refused at
start-up with one line (exit 78) by the launcher and by a worker, before anything starts; a torch newer than
the tested range whose every name checks out runs, with one warning line."""

from __future__ import annotations

import io
import os
import secrets
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler
from trainer_helpers import TINY
from typing_extensions import override

from fsdpkit.contracts import env as contracts_env
from fsdpkit.contracts import exitcodes
from fsdpkit.launcher.agent import KitElasticAgent
from fsdpkit.launcher.rendezvous.c10d import KitOpExecutor
from fsdpkit.runtime import torch_internals as internals
from fsdpkit.runtime.error_file import AtomicErrorHandler
from fsdpkit.runtime.events import read_events

REPO = Path(__file__).resolve().parents[2]
KIT_CLASSES = (KitElasticAgent, KitOpExecutor)
NEWER = "2.16.0"
"""A release above the tested range (2.11 to 2.15)."""
GET_ERROR_FILE = f"{ErrorHandler.__module__}.ErrorHandler._get_error_file_path"
"""torch's private method the kit's AtomicErrorHandler overrides."""


def test_every_private_name_the_kit_uses_is_there_on_this_torch() -> None:
    assert internals.problems(overrides=KIT_CLASSES) == []
    assert internals.check(overrides=KIT_CLASSES) is None


@pytest.mark.parametrize(
    ("version", "verdict"),
    [("2.11.0+cu130", "tested"), ("2.13.0+cpu", "tested"), ("2.12.1", "tested"), ("2.15.0", "tested"),
     ("2.14.1+cu128", "tested"), ("2.16.0", "newer"), ("3.0.0", "newer"), ("2.10.2", "refused"),
     ("1.13.1", "refused"), ("nightly", "refused")],
)  # fmt: skip
def test_the_tested_range_is_2_11_to_2_15_and_only_an_older_torch_is_refused(
    version: str, verdict: str
) -> None:
    problem, warning = internals.version_problem(version), internals.untested_warning(version)
    assert (problem is not None, warning is not None) == (verdict == "refused", verdict == "newer")
    for line in (problem, warning):
        assert line is None or (version in line and "2.11 to 2.15" in line)
    if verdict == "refused" and version != "nightly":
        assert "it is older than the kit's tested range (2.11 to 2.15)" in problem
        assert "the kit handles release differences only from 2.11 on" in problem


def test_a_name_that_is_gone_or_takes_other_parameters_is_named() -> None:
    gone = internals.Internal(module="torch.serialization", name="_no_such_function")
    assert internals.internal_problem(gone) == "torch.serialization._no_such_function is gone"
    moved = internals.Internal(module="torch.serialization", name="_save", params=("tensor", "file"))
    assert "torch.serialization._save takes (obj, zip_file" in internals.internal_problem(moved)
    no_field = internals.Internal(module="torch.distributed.device_mesh", name="DeviceMesh", fields=("_pgs",))
    assert internals.internal_problem(no_field) == "torch.distributed.device_mesh.DeviceMesh has no _pgs"


def test_an_override_of_a_hook_torch_no_longer_has_is_found() -> None:
    class Base:
        def _kept(self, group: object) -> None: ...

    class Kit(Base):
        @override
        def _kept(self, group: object) -> None: ...

        @override
        def _renamed_by_torch(self) -> None: ...

    class Drifted(Base):
        @override
        def _kept(self, group: object, timeout: int) -> None: ...

    assert internals.override_problems(Kit) == [
        f"{Kit.__qualname__}._renamed_by_torch overrides nothing in {__name__}"
    ]
    assert (
        "takes (self, group), the kit's override (self, group, timeout)"
        in internals.override_problems(Drifted)[0]
    )


def test_the_error_files_override_is_declared_and_a_rename_of_torchs_method_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """AtomicErrorHandler overrides torch's private `ErrorHandler._get_error_file_path`: the registry lists
    it and every start-up checks the override, on the launcher's side and the worker's (no `overrides`)."""
    assert GET_ERROR_FILE == (
        "torch.distributed.elastic.multiprocessing.errors.error_handler.ErrorHandler._get_error_file_path"
    )
    assert any(f"{i.module}.{i.name}" == GET_ERROR_FILE for i in internals.INTERNALS)
    assert AtomicErrorHandler in internals.OWN_OVERRIDES
    monkeypatch.setattr(ErrorHandler, "_get_error_file_path", lambda self, rank: None)
    (drifted,) = internals.problems()
    assert drifted.endswith("<lambda> takes (self, rank), the kit's override (self)")
    monkeypatch.delattr(ErrorHandler, "_get_error_file_path")
    assert internals.problems() == [
        f"torch {torch.__version__}: {GET_ERROR_FILE} is gone",
        f"torch {torch.__version__}: AtomicErrorHandler._get_error_file_path overrides nothing in "
        f"{ErrorHandler.__module__}",
    ]


def test_the_safe_checkpoint_loaders_override_hooks_the_registry_checks_at_start_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kit's `.metadata` reader and byte-item planner (fsdpkit.resilience.checkpoint.untrusted) override
    DCP's hooks: each hook, what the planner's override writes into and every private name `.metadata`
    pickles are in the registry, so a torch that renamed one is refused at start-up instead of loading
    checkpoints through torch's own pickle."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    from fsdpkit.resilience.checkpoint.untrusted import SafeLoadPlanner, SafeReader

    assert internals.override_problems(SafeReader) == []
    assert internals.override_problems(SafeLoadPlanner) == []
    names = {f"{i.module}.{i.name}" for i in internals.INTERNALS}
    dcp = "torch.distributed.checkpoint"
    assert {
        f"{dcp}.filesystem.FileSystemReader.read_metadata",
        f"{dcp}.default_planner.DefaultLoadPlanner.load_bytes",
        f"{dcp}._traverse.set_element",
        *(f"{module}.{name}" for module, name in internals.METADATA_PRIVATES),
    } <= names
    assert set(internals.metadata_privates()) == set(internals.METADATA_PRIVATES)
    monkeypatch.setattr(DefaultLoadPlanner, "load_bytes", lambda self, item: None)
    (drifted,) = internals.problems()
    assert (
        "DefaultLoadPlanner.load_bytes takes (self, item), the kit calls it with (self, read_item, value)"
        in (drifted)
    )


def test_replace_and_require_refuse_a_name_that_is_gone() -> None:
    module = types.ModuleType("torch.fake")
    module.kept = 1
    assert internals.replace(module, "kept", 2) == 1 and module.kept == 2
    with pytest.raises(internals.TorchInternalsChanged, match=r"torch\.fake\._delay is gone: the kit relies"):
        internals.replace(module, "_delay", lambda s: None)
    assert not hasattr(module, "_delay")  # nothing was added
    with pytest.raises(internals.TorchInternalsChanged, match=r"SimpleNamespace\._state_holder is gone"):
        internals.require(types.SimpleNamespace(), "_state_holder")


def test_the_zip_shortcut_writes_what_torch_load_reads() -> None:
    tensor = torch.randn(3, 5, dtype=torch.bfloat16)
    out = io.BytesIO()
    internals.serialize_tensor(out, tensor, internals.storage_alignment())
    out.seek(0)
    assert torch.equal(torch.load(out, weights_only=True), tensor)


def _with_changed_torch(
    change: str, module: str, argv: list[str], tmp: Path
) -> subprocess.CompletedProcess[str]:
    """Run `python -m MODULE ARGV` in a process whose torch was changed first by `change` (Python code). It
    holds a run token, as the kit's pods do: the only line a refusal prints is the refusal."""
    run = f"runpy.run_module({module!r}, run_name='__main__')"
    code = "\n".join(["import runpy, sys, torch", change, f"sys.argv = [{module!r}, *{argv!r}]", run])
    token = tmp / "run-token"
    token.write_text(secrets.token_hex(32) + "\n")
    token.chmod(0o600)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"}
    env[contracts_env.RUN_TOKEN_FILE] = str(token)
    for name in ("KIT_HEARTBEAT_DIR", internals.UNTESTED_WARNED_ENV, "LOCAL_RANK"):
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def _one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_torchs_rendezvous_internals_are_needed_only_on_its_rendezvous(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch.distributed.elastic.rendezvous.dynamic_rendezvous as dynamic

    monkeypatch.delattr(dynamic, "_delay")
    assert internals.problems(overrides=(KitElasticAgent,), c10d_rendezvous=False) == []
    found = internals.problems(overrides=KIT_CLASSES, c10d_rendezvous=True)
    assert found == [f"torch {torch.__version__}: {dynamic.__name__}._delay is gone"]


def test_the_launcher_on_c10d_refuses_a_torch_whose_rendezvous_internals_changed(tmp_path: Path) -> None:
    change = "import torch.distributed.elastic.rendezvous.dynamic_rendezvous as d\ndel d._delay"
    argv = [
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "127.0.0.1:29400",
        "--rdzv-id",
        "internals",
        "--nnodes",
        "1",
        "--worker-start",
        "exec",
        "--run-dir",
        str(tmp_path / "run"),
        "-m",
        "fsdpkit.trainer",
    ]
    proc = _with_changed_torch(change, "fsdpkit.launcher", argv, tmp_path)
    assert proc.returncode == exitcodes.FATAL_CONFIG
    line = _one_line(proc.stderr)
    assert (
        f"torch {torch.__version__}: torch.distributed.elastic.rendezvous.dynamic_rendezvous._delay is gone"
        in line
    )
    assert "use a supported torch (2.11 to 2.15)" in line
    assert not (tmp_path / "run" / "events").exists() or not any((tmp_path / "run" / "events").iterdir())


def _trainer_argv(tmp: Path) -> list[str]:
    return ["--run.id", "t", "--run.root", str(tmp / "runs"), *TINY, "--training.steps", "2"]


def _nothing_written(tmp: Path) -> bool:
    return not (tmp / "runs").exists() or not any((tmp / "runs").rglob("*.json*"))


def test_a_worker_refuses_a_torch_older_than_the_tested_range_before_any_process_group(
    tmp_path: Path,
) -> None:
    proc = _with_changed_torch(
        "torch.__version__ = '2.10.2'", "fsdpkit.trainer", _trainer_argv(tmp_path), tmp_path
    )
    assert proc.returncode == exitcodes.FATAL_CONFIG
    line = _one_line(proc.stderr)
    assert line.startswith(
        "error: torch 2.10.2 is not supported: it is older than the kit's tested range (2.11 to 2.15), "
        "and the kit handles release differences only from 2.11 on; install torch==2.13.0"
    )
    assert _nothing_written(tmp_path)


@pytest.mark.parametrize(
    ("change", "gone"),
    [
        ("import torch.distributed.distributed_c10d as c\ndel c._abort_process_group",
         "torch.distributed.distributed_c10d._abort_process_group is gone"),
        ("from torch.distributed.elastic.multiprocessing.errors import ErrorHandler as E\n"
         "del E._get_error_file_path",
         f"{GET_ERROR_FILE} is gone"),
    ],
    ids=["abort-group", "error-file-override"],
)  # fmt: skip
def test_a_worker_refuses_a_newer_torch_without_a_name_the_kit_needs(
    tmp_path: Path, change: str, gone: str
) -> None:
    change = f"torch.__version__ = {NEWER!r}\n{change}"
    proc = _with_changed_torch(change, "fsdpkit.trainer", _trainer_argv(tmp_path), tmp_path)
    assert proc.returncode == exitcodes.FATAL_CONFIG
    line = _one_line(proc.stderr)  # the refusal alone: no warning before it
    assert line.startswith(f"error: torch {NEWER}: {gone}")
    assert line.endswith("use a supported torch (2.11 to 2.15)")
    assert _nothing_written(tmp_path)


@pytest.mark.slow
def test_a_newer_torch_whose_names_all_check_out_trains_with_one_warning_line(tmp_path: Path) -> None:
    """Under the kit's launcher (2 ranks, forked from its zygote with the same torch): the launcher warns,
    its workers stay quiet, and the job trains to the end."""
    run_dir = tmp_path / "runs" / "t"
    launcher = ["--standalone", "--nproc-per-node", "2", "--log-dir", str(tmp_path / "logs")]
    argv = [*launcher, "--run-dir", str(run_dir), "-m", "fsdpkit.trainer", *_trainer_argv(tmp_path)]
    proc = _with_changed_torch(f"torch.__version__ = {NEWER!r}", "fsdpkit.launcher", argv, tmp_path)
    assert proc.returncode == exitcodes.OK, proc.stderr[-4000:]
    warned = [line for line in proc.stderr.splitlines() if "newer than the kit's tested range" in line]
    assert warned == [
        f"warning: torch {NEWER} is newer than the kit's tested range (2.11 to 2.15); every private torch "
        "name the kit relies on checked out, so it runs (training/runtime/torch_internals.py)"
    ], proc.stderr[-4000:]
    logs = [p.read_text(errors="replace") for p in (tmp_path / "logs").rglob("*") if p.is_file()]
    assert not any("newer than the kit's tested range" in text for text in logs)
    ends = [(e["rank"], e["step"]) for e in read_events(run_dir) if e["kind"] == "end"]
    assert sorted(ends) == [(0, 2), (1, 2)]
