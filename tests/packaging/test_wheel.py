"""The kit's wheel, as a user installs it: what it holds, and the installed kit beside a user's own code.

The wheel is built from this checkout once per session (tests/wheel_env.py); the tests marked slow install
it into a fresh venv (torch from this machine's find-links folder, the rest from the registry). The faulted
run of a user's script through the installed kit is in tests/k8s/test_k8s_own_model.py, beside the
fault-free run it is compared with.
"""

from __future__ import annotations

import configparser
import json
import subprocess
import zipfile
from pathlib import Path

import pytest
import yaml
from wheel_env import REPO, package_dirs, pyproject, user_env

NOT_IN_THE_WHEEL = {"training/Dockerfile"}
"""Files in the package folders that are not package data: the image's recipe, built from the checkout."""


def _folder_packages() -> set[str]:
    """Every folder with an __init__.py under the package folders, as the package name it installs as."""
    found = set()
    for name, folder in package_dirs().items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder)
            found.add(".".join([name, *rel.parts]))
    return found


def _wheel_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return {n for n in zf.namelist() if ".dist-info/" not in n}


def test_every_package_folder_is_listed_in_pyproject() -> None:
    """A new subpackage (a folder with an __init__.py) left out of the list would be missing from the wheel
    while the editable checkout imports it fine."""
    listed = set(pyproject()["tool"]["setuptools"]["packages"])
    folders = _folder_packages()
    assert not folders - listed, f"add to pyproject.toml's packages: {sorted(folders - listed)}"
    assert not listed - folders, f"listed in pyproject.toml, no folder: {sorted(listed - folders)}"


def test_the_wheel_holds_every_module_and_data_file_of_the_package_folders(kit_wheel: Path) -> None:
    """Each file of training/, k8s/, infra/ and ops/ (modules, the Job's templates, the price table, the
    cfn-lint rules) is in the wheel under its package's path, and nothing else of the repository is."""
    wanted = set()
    for name, folder in package_dirs().items():
        for path in (REPO / folder).rglob("*"):
            rel = path.relative_to(REPO)
            if path.is_dir() or "__pycache__" in rel.parts or rel.as_posix() in NOT_IN_THE_WHEEL:
                continue
            wanted.add("/".join([*name.split("."), *path.relative_to(REPO / folder).parts]))
    files = _wheel_files(kit_wheel)
    assert {"fsdpkit/k8s/templates/job.yaml.j2", "fsdpkit/ops/prices.json"} <= files
    assert not wanted - files, f"missing from the wheel: {sorted(wanted - files)[:20]}"
    assert not files - wanted, f"in the wheel but not in the package folders: {sorted(files - wanted)[:20]}"


def _module_file(module: str, files: set[str]) -> str | None:
    """The wheel's file that `python -m module` (or an import) runs, None when there is none."""
    path = module.replace(".", "/")
    for candidate in (f"{path}/__main__.py", f"{path}.py", f"{path}/__init__.py"):
        if candidate in files:
            return candidate
    return None


def test_the_wheels_console_scripts_are_pyprojects_and_point_into_it(kit_wheel: Path) -> None:
    scripts = pyproject()["project"]["scripts"]
    with zipfile.ZipFile(kit_wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt"))
        entry_points = configparser.ConfigParser()
        entry_points.read_string(zf.read(name).decode())
    assert dict(entry_points["console_scripts"]) == scripts
    files = _wheel_files(kit_wheel)
    for script, target in scripts.items():
        module = target.split(":")[0]
        assert _module_file(module, files), f"{script}: {module} is not in the wheel"


def test_the_jobs_container_commands_run_modules_the_wheel_holds(kit_wheel: Path) -> None:
    """The image installs the wheel: every `python -m MODULE` of the rendered Job (the launcher, the kit's
    trainer, the rendezvous store) must be a module of it, run by the image venv's `python`."""
    files = _wheel_files(kit_wheel)
    modules = []
    for manifest in sorted((REPO / "tests" / "k8s" / "golden" / "p5").glob("*.yaml")):
        for doc in yaml.safe_load_all(manifest.read_text(encoding="utf-8")):
            pod = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
            for container in pod.get("containers", []):
                argv = [*container.get("command", []), *container.get("args", [])]
                assert argv[0] == "python", f"{manifest.name}: {argv[0]}"
                modules += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-m"]
    assert {"fsdpkit.launcher", "fsdpkit.trainer", "fsdpkit.launcher.store"} <= set(modules), modules
    for module in modules:
        assert _module_file(module, files), f"the Job runs python -m {module}, which the wheel lacks"


USER_SCRIPT = """
import json, sys
from fsdpkit import resilience
import fsdpkit.launcher.cli, fsdpkit.trainer.train, fsdpkit.k8s.cli  # the kit's programs too
kit_imported_training = "training" in sys.modules
import training
print(json.dumps({"training": training.__file__, "who": training.WHO, "resilience": resilience.__file__,
                  "kit_imported_training": kit_imported_training}))
"""


@pytest.mark.slow
def test_a_users_own_training_package_beside_the_installed_kit(wheel_venv: Path, tmp_path: Path) -> None:
    """A user's project with its own `training` package imports the kit as `fsdpkit`: neither shadows the
    other, and the kit never imports a module named `training`."""
    project = tmp_path / "project"
    (project / "training").mkdir(parents=True)
    (project / "training" / "__init__.py").write_text('WHO = "the user\'s"\n', encoding="utf-8")
    proc = subprocess.run(
        [str(wheel_venv / "bin" / "python"), "-c", USER_SCRIPT],
        cwd=project, env=user_env(wheel_venv), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout)
    assert seen["who"] == "the user's" and Path(seen["training"]).parent == project / "training"
    assert Path(seen["resilience"]).is_relative_to(wheel_venv), seen["resilience"]
    assert not seen["kit_imported_training"]


@pytest.mark.slow
def test_every_console_script_starts_from_the_fresh_venv(wheel_venv: Path, tmp_path: Path) -> None:
    """`--help` of each script, from a folder outside the checkout: its module and what it imports are in
    the wheel and the extras a user installs (hf, k8s, report)."""
    for script in pyproject()["project"]["scripts"]:
        proc = subprocess.run(
            [str(wheel_venv / "bin" / script), "--help"],
            cwd=tmp_path, env=user_env(wheel_venv), capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, f"{script} --help: exit {proc.returncode}\n{proc.stderr[-2000:]}"
        assert proc.stdout.strip(), f"{script} --help printed nothing"
