"""Which Kubernetes versions the kit's manifests support: from the first with every Job feature the kit
relies on, to the newest whose schemas kubernetes-validate bundles (it validates offline)."""

from __future__ import annotations

import functools
import re

MIN_VERSION = (1, 29)
"""backoffLimitPerIndex, podReplacementPolicy and podFailurePolicy rules without onPodConditions are beta
and on by default from 1.29; older API servers drop or refuse those fields (the 1.28 schema fails)."""


@functools.cache
def bundled_versions() -> tuple[str, ...]:
    """MAJOR.MINOR versions whose schemas kubernetes-validate bundles, oldest first, without repeats."""
    from kubernetes_validate.utils import all_versions  # imported late: only renders need it

    minors = {tuple(int(x) for x in v.split(".")[:2]) for v in all_versions()}
    return tuple(f"{a}.{b}" for a, b in sorted(minors))


def supported_versions() -> tuple[str, ...]:
    """The versions a render may target."""
    return tuple(v for v in bundled_versions() if tuple(int(x) for x in v.split(".")) >= MIN_VERSION)


def version_problem(text: str) -> str | None:
    """None for a supported MAJOR.MINOR, else the rule with the supported range (one phrase)."""
    supported = supported_versions()
    span = f"{supported[0]} to {supported[-1]}"
    if not re.fullmatch(r"\d+\.\d+", text):
        return f"must be MAJOR.MINOR, e.g. {supported[-1]}; supported: {span}"
    if text not in supported:
        oldest = f"{MIN_VERSION[0]}.{MIN_VERSION[1]}"
        return (
            f"is not supported; the kit's Job needs {oldest} or newer and its schemas are bundled up to "
            f"{supported[-1]}: use one of {span}"
        )
    return None
