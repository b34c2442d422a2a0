"""The user's training command (ENTRYPOINT) and the image reference (IMAGE): parsed and checked once.

`parse_entrypoint` splits ENTRYPOINT like a shell (`shlex.split`, no expansion) and sorts it into what
every launcher can start: a Python module (`python -m mod args`), a Python script (`python train.py args`)
or any other program (`bash run.sh`, `/opt/x/train`). `python`, `python3` and `python3.N` as bare names
mean the image's interpreter, which the launcher starts itself (the kit launcher's warm workers then work
for modules and scripts alike); an interpreter given by path is a program like any other. Every broken rule
raises `ValuesError` with one line: the key, the value seen (control characters escaped), the rule, the fix.

`image_problem` checks IMAGE by Docker's reference grammar (distribution/reference):
`[registry[:port]/]path[:tag][@sha256:<64 hex>]`, path components lower-case.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Literal

from fsdpkit.k8s.model import ValuesError

KEY = "ENTRYPOINT"
_PYTHON = re.compile(r"python(3(\.[0-9]+)?)?")
"""Bare interpreter names that mean the image's Python (the launcher's own)."""
_LAUNCHERS = frozenset(
    {
        "torchrun",
        "ft_launcher",
        "torch.distributed.run",
        "torch.distributed.launch",
        "fsdpkit.launcher",
        "fsdpkit.launcher.cli",
    }
)
"""Launchers: the Job starts one already (LAUNCHER=); one inside it would launch every rank again."""
KIT_TRAINER_MODULE = "fsdpkit.trainer"


@dataclass(frozen=True, kw_only=True)
class Entrypoint:
    """What every worker runs: a module, a script path or a program, and its arguments."""

    kind: Literal["module", "script", "program"]
    target: str
    args: tuple[str, ...]


def shown(text: str) -> str:
    """`text` for a one-line message: control characters and bytes that were not UTF-8 escaped."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


def _fail(raw: str, rule: str) -> ValuesError:
    return ValuesError(f"{KEY}={shown(raw)}: {rule}")


def parse_entrypoint(raw: str) -> Entrypoint | None:
    """The checked ENTRYPOINT; None for the empty default (the kit's trainer)."""
    if raw == "":
        return None
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:  # bytes that were not UTF-8 arrive as lone surrogates
        raise _fail(raw, "holds bytes that are not UTF-8; give the command as UTF-8 text") from None
    if any(not c.isprintable() and c != " " for c in raw):
        raise _fail(
            raw,
            "holds a control or invisible character (a tab, newline, NUL, ...); give the command on one "
            "line, words separated by spaces",
        )
    try:
        words = shlex.split(raw)
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        raise _fail(
            raw, f"is not a command line ({exc}); balance the quotes, e.g. python train.py --name 'a b'"
        ) from None
    if not words or not words[0]:
        raise _fail(
            raw,
            "names no program; give a command such as python -m myproject.train, or leave ENTRYPOINT "
            "out for the kit's trainer",
        )
    first = words[0]
    if first.startswith("-"):
        raise _fail(raw, f"starts with an option ({first}); start with the program, e.g. python -m mod")
    _no_expansion(raw, first, "the program")
    if "=" in first and first.partition("=")[0].isidentifier():
        name = first.partition("=")[0]
        raise _fail(
            raw, f"starts with an env assignment ({first}); set it as ENV.{name}=... and drop it here"
        )
    if first in _LAUNCHERS:
        raise _fail(raw, _launcher_rule(first))
    if not _PYTHON.fullmatch(first):
        return Entrypoint(kind="program", target=first, args=tuple(words[1:]))
    return _python(raw, words[1:])


def _no_expansion(raw: str, word: str, what: str) -> None:
    if "$(" in word:
        raise _fail(
            raw,
            f"{what} {word!r} holds '$(', which Kubernetes expands in a container's command; name it "
            "directly (arguments may use $(VAR) of the pod's env on purpose)",
        )


def _launcher_rule(name: str) -> str:
    return (
        f"{name} is a launcher, and the Job starts one already (LAUNCHER=kit, torchrun or ft_launcher); give "
        "only the training command, e.g. python -m myproject.train"
    )


def _python(raw: str, rest: list[str]) -> Entrypoint:
    """`python [-u] (-m MODULE | SCRIPT) ARGS...`: the forms a launcher starts with its own interpreter."""
    i = 0
    while i < len(rest) and rest[i] == "-u":  # the launchers run Python unbuffered already
        i += 1
    if i == len(rest):
        raise _fail(raw, "python alone starts a prompt; give -m MODULE or a script, e.g. python -m mod")
    word = rest[i]
    if word == "-m" or (word.startswith("-m") and not word.startswith("--")):
        module = word[2:] or (rest[i + 1] if i + 1 < len(rest) else "")
        args = rest[i + 2 :] if word == "-m" else rest[i + 1 :]
        if not module:
            raise _fail(raw, "python -m needs a module name, e.g. python -m myproject.train")
        _no_expansion(raw, module, "the module")
        if module.endswith(".py") or not all(part.isidentifier() for part in module.split(".")):
            raise _fail(
                raw,
                f"-m {module}: a module name is dotted Python identifiers (letters, digits, '_'; no "
                "path, no '.py'), e.g. -m myproject.train; run a file as python path/to/train.py",
            )
        if module in _LAUNCHERS:
            raise _fail(raw, _launcher_rule(module))
        if module in (KIT_TRAINER_MODULE, f"{KIT_TRAINER_MODULE}.train"):
            raise _fail(
                raw,
                "-m fsdpkit.trainer is the kit's trainer: leave ENTRYPOINT out and set its values "
                "(MODEL=, STEPS=, TRAIN.<section>.<field>=)",
            )
        return Entrypoint(kind="module", target=module, args=tuple(args))
    if word.startswith("-"):
        raise _fail(
            raw,
            f"python option {word} is not passed on by the launcher (it starts python -u itself); drop "
            "it (most options have an env form: ENV.PYTHONWARNINGS=..., ENV.PYTHONDEVMODE=1), or give "
            "the interpreter by path to run it as a program",
        )
    _no_expansion(raw, word, "the script")
    return Entrypoint(kind="script", target=word, args=tuple(rest[i + 1 :]))


# Docker's reference grammar (github.com/distribution/reference, regexp.go); digests: sha256 only.
_ALNUM = r"[a-z0-9]+"
_PATH_COMPONENT = rf"{_ALNUM}(?:(?:[_.]|__|-+){_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
IMAGE_REFERENCE = re.compile(rf"(?P<name>{_NAME})(?::[\w][\w.-]{{0,127}})?(?:@sha256:[a-f0-9]{{64}})?", re.A)
IMAGE_TAG = re.compile(r"[\w][\w.-]{0,127}", re.A)
NAME_MAX = 255
"""Longest repository name (registry and path) a registry accepts."""
IMAGE_RULE = (
    "is not an image reference [REGISTRY[:PORT]/]PATH[:TAG][@sha256:<64 hex>] (path lower-case, no "
    "spaces), e.g. 123456789012.dkr.ecr.us-east-2.amazonaws.com/my-train:v1"
)


def image_problem(image: str) -> str | None:
    """Why `image` is not a Docker image reference (a phrase), or None."""
    m = IMAGE_REFERENCE.fullmatch(image)
    if m is None:
        return IMAGE_RULE
    if len(m["name"]) > NAME_MAX:
        return f"has a repository name of {len(m['name'])} characters (at most {NAME_MAX})"
    return None
