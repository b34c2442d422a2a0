"""The trainer image holds every repository module the trainer imports (the image is never built here)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _root_modules_imported_by_training() -> set[str]:
    roots = {p.stem for p in REPO.glob("*.py")}
    found = set()
    for path in (REPO / "training").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            found |= {n.split(".")[0] for n in names} & roots
    return found


def test_every_root_module_the_trainer_imports_is_in_the_image():
    needed = _root_modules_imported_by_training()
    assert needed, "the trainer imports fielddocs/cliargs today; this test must see them"
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    dockerfile = (REPO / "training" / "Dockerfile").read_text()
    copied = " ".join(line for line in dockerfile.splitlines() if line.startswith("COPY "))
    for name in sorted(needed):
        assert f"!{name}.py" in ignore, f"{name}.py is left out of the build context by .dockerignore"
        assert f"{name}.py" in copied, f"{name}.py is not copied into the image by training/Dockerfile"


def _pins(text: str) -> dict[str, str]:
    """`name==version` pins in a requirements file or a Dockerfile's pip lines, by normalized name."""
    found = re.findall(r"\"?([A-Za-z0-9][A-Za-z0-9._-]*)==([\w.${}]+)\"?", text)
    return {name.lower().replace("_", "-"): version for name, version in found}


def test_the_image_installs_every_pinned_package_the_trainer_imports_at_the_same_pin():
    """A package the trainer imports that the image lacks fails the first job, not the build."""
    dists = importlib.metadata.packages_distributions()
    imported = set()
    for path in (REPO / "training").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    wanted = _pins((REPO / "requirements.txt").read_text())
    needed = {d.lower().replace("_", "-") for m in imported for d in dists.get(m, ())} & set(wanted)
    assert {"torch", "transformers", "crc32c"} <= needed, needed
    dockerfile = (REPO / "training" / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", dockerfile, flags=re.M))
    pins = _pins(dockerfile)
    installed = {name: args.get(v[2:-1], v) if v.startswith("${") else v for name, v in pins.items()}
    for name in sorted(needed):
        assert name in installed, f"training/ imports {name} but training/Dockerfile does not install it"
        assert installed[name] == wanted[name], f"{name}: image {installed[name]}, pinned {wanted[name]}"


def test_hadolint_passes_on_the_trainer_dockerfile():
    """Findings are fixed or acknowledged in the file with a reason (`# hadolint ignore=` under one)."""
    hadolint = Path(sys.executable).parent / "hadolint"
    run = subprocess.run(
        [str(hadolint), "--no-color", str(REPO / "training" / "Dockerfile")], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = (REPO / "training" / "Dockerfile").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# hadolint ignore="):
            assert lines[i - 1].startswith("#") and not lines[i - 1].startswith("# hadolint"), (
                f"line {i + 1}: an acknowledged finding needs its reason on the comment line above"
            )
