"""The one module that touches torch's private names (training/runtime/torch_internals.py): every name it
lists exists on this torch, and a torch without one of them, or of a release outside the supported range, is
refused at start-up with one line (exit 78) by the launcher and by a worker, before anything starts."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from typing_extensions import override

from fsdpkit.contracts import exitcodes
from fsdpkit.launcher.agent import KitElasticAgent
from fsdpkit.launcher.rendezvous.c10d import KitOpExecutor
from fsdpkit.runtime import torch_internals as internals

REPO = Path(__file__).resolve().parents[2]
KIT_CLASSES = (KitElasticAgent, KitOpExecutor)


def test_every_private_name_the_kit_uses_is_there_on_this_torch() -> None:
    assert internals.problems(overrides=KIT_CLASSES) == []
    assert internals.check(overrides=KIT_CLASSES) is None


@pytest.mark.parametrize(
    ("version", "supported"),
    [("2.11.0+cu130", True), ("2.13.0+cpu", True), ("2.12.1", True), ("2.10.2", False), ("2.14.0", False),
     ("3.0.0", False), ("nightly", False)],
)  # fmt: skip
def test_the_supported_range_is_2_11_to_2_13(version: str, supported: bool) -> None:
    problem = internals.version_problem(version)
    assert (problem is None) is supported
    if problem is not None:
        assert version in problem and "2.11 to 2.13" in problem


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
    """Run `python -m MODULE ARGV` in a process whose torch was changed first by `change` (Python code)."""
    run = f"runpy.run_module({module!r}, run_name='__main__')"
    code = "\n".join(["import runpy, sys, torch", change, f"sys.argv = [{module!r}, *{argv!r}]", run])
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp)}
    env.pop("KIT_HEARTBEAT_DIR", None)
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
    assert "use a supported torch (2.11 to 2.13)" in line
    assert not (tmp_path / "run" / "events").exists() or not any((tmp_path / "run" / "events").iterdir())


def test_a_worker_refuses_an_unsupported_torch_before_any_process_group(tmp_path: Path) -> None:
    argv = [
        "--run.id",
        "t",
        "--run.root",
        str(tmp_path / "runs"),
        "--model.name",
        "tiny",
        "--training.steps",
        "2",
    ]
    proc = _with_changed_torch("torch.__version__ = '2.15.0'", "fsdpkit.trainer", argv, tmp_path)
    assert proc.returncode == exitcodes.FATAL_CONFIG
    line = _one_line(proc.stderr)
    assert "torch 2.15.0 is not supported (the kit supports 2.11 to 2.13)" in line
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.json*"))
