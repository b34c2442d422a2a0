"""The house's import rules, in one place, and the check that holds the code to them.

`python -m tools.import_rules [ROOT]` derives the import graph from the code (every `import`, type-only and
function-local ones included, and `importlib.import_module("...")` with a literal name) and prints one line
per broken rule; exit 1 when any is broken. tests/tools/test_import_rules.py runs it on the repository and
breaks each rule once on purpose.

The kit's code lives in the folders the project was specified with and is imported under one name,
`fsdpkit` (`PACKAGE_DIRS`, as pyproject.toml installs it): training/ is `fsdpkit`, k8s/ `fsdpkit.k8s`, infra/
`fsdpkit.infra`, ops/ `fsdpkit.ops`. The rules (the tables below are the rules; the functions apply them):
1. **No circle** among the modules, whatever kind of import closes it.
2. **Floors.** The training side is built in floors, bottom first (`FLOORS`): a package imports only itself
   and the floors below it, never a floor above or a sibling on its own floor.
3. **Parts meet at contracts.** infra, k8s and ops import the training side only through
   `fsdpkit.contracts`; one part imports another only where `PART_EDGES` says so, with the reason beside it.
4. **Libraries by floor** (`FORBIDDEN`): the training side imports no AWS or CDK code; the contracts use the
   standard library only (infra, k8s and ops import them without torch); the resilience API imports no
   model, tokenizer or dataset library (it knows no model, data or loop); infra, k8s and ops import no torch.
5. **The public API is the way in** (`PUBLIC_ONLY`): the kit's trainer and the examples import of the kit
   only `fsdpkit.resilience` itself (never one of its modules) and the contracts.
6. **One name** (`REPO_NAMES`): nothing imports the kit by its folders' names (`training.*`, `k8s`, ...),
   tests included: a second name would load a second copy of every module (two registries, two of each class).
   The folders' names serve `python -m training.launcher` and the like from a checkout, whose `__main__`
   imports fsdpkit.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIRS: dict[str, str] = {
    "training": "fsdpkit", "k8s": "fsdpkit.k8s", "infra": "fsdpkit.infra", "ops": "fsdpkit.ops",
}  # fmt: skip
"""Folder -> the package name it is installed and imported as (pyproject.toml's package-dir)."""
TOPS: tuple[str, ...] = ("app", "tools", "demo", "bench", "examples")
"""Other top-level folders and modules whose imports are checked; they sit on top and may use anything."""
REPO_NAMES: tuple[str, ...] = (*PACKAGE_DIRS, "cliargs", "fielddocs")
"""The folders' own names (and modules that moved into the contracts): never imported (rule 6)."""

FLOORS: tuple[tuple[str, ...], ...] = (
    ("fsdpkit.contracts",),  # what every part shares: env names, exit codes, run layout, catalog, shapes
    ("fsdpkit.runtime",),  # process plumbing: events, process groups, torch internals, the launcher channel
    ("fsdpkit.resilience", "fsdpkit.launcher"),  # the public API; the launcher (a separate program)
    # the kit's trainer; reports; model export; the data tools (they write the API's token format)
    ("fsdpkit.trainer", "fsdpkit.analysis", "fsdpkit.export", "fsdpkit.data"),
)
"""Bottom first. Two packages on one floor do not import each other: the API and the launcher meet only in
the runtime's channel (heartbeat, hang interrupt, error file, stacks, eviction) and the contracts."""

GOVERNED = ("fsdpkit.infra", "fsdpkit.k8s", "fsdpkit.ops")
"""The parts whose imports of one another and of the training side are limited to `PART_EDGES`."""
PART_EDGES: dict[tuple[str, str], str] = {
    ("fsdpkit.infra", "fsdpkit.contracts"): "the metric catalog the dashboard and alarms draw",
    (
        "fsdpkit.k8s",
        "fsdpkit.contracts",
    ): "env names, defaults, ports, the global-batch rule, metric settings",
    ("fsdpkit.ops", "fsdpkit.contracts"): "model shapes and peak FLOPs for the plan, the run folder's layout",
    ("fsdpkit.k8s", "fsdpkit.ops.plan"): "make train-job prints the plan's one-line summary of its job",
    ("fsdpkit.ops", "fsdpkit.infra.config"): "make plan reads cdk.json through infra's typed config",
    ("fsdpkit.ops", "fsdpkit.infra.errors"): "that config's one-line error",
}
"""Imports from one part into another that are allowed, with why; every other one is refused. Parts are
infra, k8s, ops and the training side's floors; app.py, tools, demo, bench and examples may use anything."""

STDLIB_ONLY = ("fsdpkit.contracts",)
TRAINING_SIDE = tuple(p for floor in FLOORS for p in floor)
_AWS = ("boto3", "botocore", "aws_cdk", "constructs", "cdk_nag", "jinja2", "moto")
FORBIDDEN: dict[str, tuple[str, ...]] = {
    **{side: _AWS for side in TRAINING_SIDE},
    "fsdpkit.resilience": (*_AWS, "transformers", "tokenizers", "datasets", "safetensors"),
    "fsdpkit.infra": ("torch",),
    "fsdpkit.k8s": ("torch", "aws_cdk"),
    "fsdpkit.ops": ("torch", "aws_cdk"),
}  # fmt: skip
"""Libraries a package never imports (a package of the importing module -> top-level library names)."""

API = "fsdpkit.resilience"
PUBLIC_ONLY: tuple[str, ...] = ("fsdpkit.trainer", "examples")
"""Users of the API: of the kit they import only the API package itself (`from fsdpkit import resilience`
or its names, never its modules) and the contracts; a user's script does the same."""

SKIP_DIRS = frozenset({".git", "node_modules", "cdk.out", "build", "dist", "runs", "__pycache__"})


@dataclass(frozen=True, order=True)
class Import:
    source: str
    """The importing module."""
    target: str
    """The imported module: the longest name that is a module of the tree, else the top-level name."""
    path: str
    line: int
    written: str = ""
    """The name as the source wrote it (before resolving)."""


@dataclass(frozen=True, order=True)
class Violation:
    path: str
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.message}"


def _module_name(root: Path, path: Path) -> str:
    """The name a file is imported as: its folder's package name (`PACKAGE_DIRS`), else its path."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts and parts[0] in PACKAGE_DIRS:
        return ".".join([PACKAGE_DIRS[parts[0]], *parts[1:]])
    return ".".join(parts)


def find_modules(root: Path, *, tops: Iterable[str] = (*PACKAGE_DIRS, *TOPS)) -> dict[str, Path]:
    """Every checked module under `root` (the folders `tops`): import name -> file."""
    found: dict[str, Path] = {}
    for top in sorted(tops):
        for path in _python_files(root, top):
            if name := _module_name(root, path):
                found[name] = path
    return found


def _python_files(root: Path, top: str) -> list[Path]:
    """`top`.py or the .py files under the folder `top`, without descending into skipped or hidden folders
    (a venv being written must not be read)."""
    single = root / f"{top}.py"
    if single.is_file():
        return [single]
    files: list[Path] = []
    for folder, dirs, names in os.walk(root / top):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
        files += [Path(folder, n) for n in sorted(names) if n.endswith(".py")]
    return files


def _resolve(name: str, modules: dict[str, Path]) -> str:
    """The longest prefix of `name` that is a module of the tree; else its top-level name."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return parts[0]


def _from_base(source: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = source.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _literal_import(node: ast.Call) -> str | None:
    """`importlib.import_module("x")` or `__import__("x")` with a literal name."""
    func = node.func
    named = (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id in ("import_module", "__import__")
    )
    if named and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        return node.args[0].value
    return None


def imports_of(name: str, path: Path, modules: dict[str, Path], root: Path) -> Iterator[Import]:
    """Every import in one file, each resolved to a module of the tree or a top-level library name."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    rel, is_package = str(path.relative_to(root)), path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(name, _resolve(alias.name, modules), rel, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(name, node, is_package)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                target = _resolve(full if full in modules else base, modules)
                yield Import(name, target, rel, node.lineno, full)
        elif isinstance(node, ast.Call) and (literal := _literal_import(node)):
            yield Import(name, _resolve(literal, modules), rel, node.lineno, literal)


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _owner(module: str, packages: Iterable[str]) -> str | None:
    """The longest of `packages` that holds `module`."""
    held = [p for p in packages if _within(module, p)]
    return max(held, key=len) if held else None


def _floor(module: str) -> tuple[int, str] | None:
    for level, packages in enumerate(FLOORS):
        if owner := _owner(module, packages):
            return level, owner
    return None


def check_floors(imp: Import) -> str | None:
    """Rule 2: only downward between training's floors (and the shared helpers below them)."""
    mine, theirs = _floor(imp.source), _floor(imp.target)
    if mine is None or theirs is None or mine[1] == theirs[1]:
        return None
    if theirs[0] > mine[0]:
        return f"{imp.source} imports {imp.target}, a floor above it ({theirs[1]} over {mine[1]})"
    if theirs[0] == mine[0]:
        return f"{imp.source} imports {imp.target}: {mine[1]} and {theirs[1]} share a floor and stay apart"
    return None


def _part(module: str) -> str | None:
    """infra, k8s or ops, or the training side's floor package that holds `module`; None for the rest."""
    return _owner(module, GOVERNED) or _owner(module, TRAINING_SIDE)


def check_parts(imp: Import) -> str | None:
    """Rule 3: infra, k8s and ops reach another part only along `PART_EDGES`."""
    mine, theirs = _owner(imp.source, GOVERNED), _part(imp.target)
    if mine is None or theirs is None or theirs == mine:
        return None
    if any(edge[0] == mine and _within(imp.target, edge[1]) for edge in PART_EDGES):
        return None
    return f"{imp.source} imports {imp.target}: {mine} meets other parts only at {_edges_of(mine)}"


def _edges_of(part: str) -> str:
    return ", ".join(target for source, target in PART_EDGES if source == part) or "nothing"


def check_libraries(imp: Import, modules: dict[str, Path]) -> str | None:
    """Rule 4: the libraries each package never imports."""
    library = imp.target.split(".")[0]
    if imp.target in modules or library in ("fsdpkit", *REPO_NAMES, *TOPS):
        return None
    for package in STDLIB_ONLY:
        if _within(imp.source, package) and library not in sys.stdlib_module_names:
            return f"{imp.source} imports {library}: {package} uses the standard library only"
    owner = _owner(imp.source, FORBIDDEN)
    if owner is not None and library in FORBIDDEN[owner]:
        return f"{imp.source} imports {library}, which {owner} never imports"
    return None


def check_public_api(imp: Import) -> str | None:
    """Rule 5: the kit's trainer and the examples use the API package and the contracts, nothing else."""
    user = _owner(imp.source, PUBLIC_ONLY)
    if user is None or not _within(imp.target, "fsdpkit") or _within(imp.target, user):
        return None
    if imp.target == API or _within(imp.target, "fsdpkit.contracts"):
        return None
    return f"{imp.source} imports {imp.target}: a user of the API imports `{API}` and the contracts only"


def check_one_name(imp: Import) -> str | None:
    """Rule 6: the kit is imported as fsdpkit, never by its folders' names."""
    written = imp.written or imp.target
    if written.split(".")[0] not in REPO_NAMES:
        return None
    return f"{imp.source} imports {written}: import the kit as fsdpkit (one name, one copy of each module)"


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _is_parent(a: str, b: str) -> bool:
    """A package and a module inside it: importing the package's own modules is not a circle to report."""
    return _within(b, a) or _within(a, b)


def check(root: Path) -> list[Violation]:
    """Every broken rule under `root`, sorted by file and line."""
    modules = find_modules(root)
    found: list[Violation] = []
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        for imp in imports_of(name, path, modules, root):
            if imp.target in modules and imp.target != name and not _is_parent(name, imp.target):
                graph.setdefault(name, set()).add(imp.target)
            for rule, message in (
                ("floors", check_floors(imp)),
                ("parts", check_parts(imp)),
                ("libraries", check_libraries(imp, modules)),
                ("public-api", check_public_api(imp)),
                ("one-name", check_one_name(imp)),
            ):
                if message:
                    found.append(Violation(imp.path, imp.line, rule, message))
    for name, path in find_modules(root, tops=("tests",)).items():  # the tests keep the one name too
        for imp in imports_of(name, path, modules, root):
            if message := check_one_name(imp):
                found.append(Violation(imp.path, imp.line, "one-name", message))
    for group in circles(graph):
        first = modules[group[0]]
        message = "import circle among " + ", ".join(group)
        found.append(Violation(str(first.relative_to(root)), 1, "circles", message))
    return sorted(set(found))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.import_rules", description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args(argv)
    broken = check(args.root)
    for violation in broken:
        print(violation)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
