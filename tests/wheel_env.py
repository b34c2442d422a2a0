"""The kit as a user gets it: its wheel, built from this checkout, installed into a fresh venv.

Shared by tests/packaging (what the wheel holds; a user's own `training` package beside the installed kit)
and tests/k8s (a user's script, copied out of the checkout, run by the installed kit through faults). The
fixtures that build them once per session are in tests/conftest.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEV_LOCK = REPO / "requirements" / "dev.txt"
USER_EXTRAS = "hf,k8s,report"
"""What a user who trains their own model and tries the Job on their machine installs: the HF model and
tokenizer (hf), kit-job (k8s) and the report it prints when the job ends (report)."""
INSTALL_TIMEOUT_S = 900
"""A fresh venv's install (torch from this machine's find-links folder, the rest from the registry) takes
about a minute; past this the registry is unreachable."""


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def package_dirs() -> dict[str, str]:
    """Package name -> its folder in the checkout (pyproject.toml's package-dir: fsdpkit is training/)."""
    return dict(pyproject()["tool"]["setuptools"]["package-dir"])


def build_wheel(out: Path) -> Path:
    """`python -m build --wheel` on a copy of what the wheel is built from (pyproject.toml, README.md, the
    package folders: training/Dockerfile's wheel stage copies the same): a build in the checkout would write
    build/ and *.egg-info there, under a concurrent test's feet. Built without isolation, with the venv's
    setuptools (the dev lock keeps it in pyproject's build-system range): offline, a second or two."""
    src = out / "src"
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for folder in sorted(set(package_dirs().values())):
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = out / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(src)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = dist.glob("*.whl")
    return wheel


def lock_pins() -> str:
    """The dev lock's `name==version` lines without their hashes: constraints that give a fresh venv the
    versions the tests run on (torch's CPU build from this machine's find-links folder among them)."""
    lines = DEV_LOCK.read_text(encoding="utf-8").splitlines()
    return "".join(line.split()[0] + "\n" for line in lines if line[:1].isalnum())


def user_env(venv: Path) -> dict[str, str]:
    """A shell with `venv` activated and nothing of the checkout: no PYTHONPATH, the project's venv off
    PATH, `venv`'s bin/ first."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    ours = Path(sys.executable).parent.resolve()
    path = [d for d in env.get("PATH", "").split(os.pathsep) if d and Path(d).resolve() != ours]
    return env | {"PATH": os.pathsep.join([str(venv / "bin"), *path]), "VIRTUAL_ENV": str(venv)}


def make_venv(root: Path, wheel: Path, extras: str = USER_EXTRAS) -> Path:
    """A new venv at `root` (not the project's, no system site-packages) with `wheel[extras]` installed by
    pip as a user would, the dev lock's versions as constraints; its folder."""
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    constraints = root / "constraints.txt"
    constraints.write_text(lock_pins(), encoding="utf-8")
    # --no-compile: bytecode only for what a run imports, not for all of torch (a third of the install).
    pip = [str(root / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    proc = subprocess.run(
        [*pip, "--no-compile", "-c", str(constraints), f"{wheel}[{extras}]"],
        env=user_env(root),
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root
