"""The trainer image holds every repository module the trainer imports (the image is never built here)."""

from __future__ import annotations

import ast
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
