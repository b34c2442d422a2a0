"""The trainer image installs the hashed image lock and the kit's wheel, nothing else of the repository (the
image is never built here: no Docker engine; the wheel itself is tested in tests/packaging)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOCKS = REPO / "requirements"
DOCKERFILE = REPO / "training" / "Dockerfile"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lock(name: str) -> dict[str, tuple[str, int]]:
    """A pip-compile lock: normalized name -> (version, number of hashes)."""
    found: dict[str, tuple[str, int]] = {}
    current = None
    for line in (LOCKS / name).read_text(encoding="utf-8").splitlines():
        if match := PIN.match(line):
            current = _norm(match[1])
            found[current] = (match[2], 0)
        elif line.strip().startswith("--hash=sha256:") and current is not None:
            version, hashes = found[current]
            found[current] = (version, hashes + 1)
        elif line[:1].isalnum() or line.startswith("-"):
            raise AssertionError(f"requirements/{name}: not a pinned requirement: {line!r}")
    return found


def test_every_lock_pins_each_requirement_with_its_hashes():
    """pip's --require-hashes refuses a lock with one requirement unpinned or without a hash."""
    for name, python in (("dev.txt", "3.11"), ("image.txt", "3.12"), ("build.txt", "3.12")):
        pins = _lock(name)
        assert pins, name
        unhashed = sorted(n for n, (_, hashes) in pins.items() if hashes == 0)
        assert not unhashed, f"requirements/{name}: no hash for {unhashed}"
        header = (LOCKS / name).read_text(encoding="utf-8").splitlines()[1]
        assert f"with Python {python}" in header, f"requirements/{name} resolved for another Python: {header}"


def _final_stage(text: str) -> str:
    return text[text.rindex("\nFROM ") :]


def test_the_image_installs_the_lock_then_the_wheel_and_no_source_folder():
    text = DOCKERFILE.read_text(encoding="utf-8")
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    final = _final_stage(code)
    assert "python -m build --wheel" in code
    assert "pip install --require-hashes -r /tmp/image.txt" in final
    assert "pip install --no-deps /tmp/dist/*.whl" in final and "pip check" in final
    assert "PYTHONPATH" not in code
    sources = [line.split()[1:-1] for line in final.splitlines() if line.startswith("COPY ")]
    assert not sources, f"the final stage copies {sources}: it installs the wheel instead"


def test_the_build_context_holds_what_the_dockerfile_copies_and_mounts():
    text = DOCKERFILE.read_text(encoding="utf-8")
    used = set(re.findall(r"--mount=type=bind,source=([^,\s]+)", text))
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            used |= {s.rstrip("/") for s in line.split()[1:-1]}
    allowed = {
        line[1:].rstrip("/")
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.startswith("!")
    }
    assert used and not used - allowed, f".dockerignore leaves out {sorted(used - allowed)}"


def test_the_image_lock_pins_what_the_trainer_imports_at_the_tested_versions():
    """A package the trainer imports that the image lacks fails the first job, not the build; one at another
    version than the tests ran on is untested (torch: the same release, the CUDA build in the image)."""
    dists = importlib.metadata.packages_distributions()
    imported = set()
    for path in (REPO / "training").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    tested, image = _lock("dev.txt"), _lock("image.txt")
    needed = {_norm(d) for m in imported for d in dists.get(m, ())} & set(tested)
    assert {"torch", "transformers", "crc32c"} <= needed, needed
    for name in sorted(needed):
        assert name in image, f"training/ imports {name} but requirements/image.txt does not pin it"
        want, got = tested[name][0].split("+")[0], image[name][0]
        assert got == want, f"{name}: image {got}, tested {want}; run make lock"


def test_hadolint_passes_on_the_trainer_dockerfile():
    """Findings are fixed or acknowledged in the file with a reason (`# hadolint ignore=` under one)."""
    hadolint = Path(sys.executable).parent / "hadolint"
    run = subprocess.run([str(hadolint), "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = DOCKERFILE.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# hadolint ignore="):
            assert lines[i - 1].startswith("#") and not lines[i - 1].startswith("# hadolint"), (
                f"line {i + 1}: an acknowledged finding needs its reason on the comment line above"
            )
