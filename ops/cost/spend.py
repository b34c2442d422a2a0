"""Spend from Cost Explorer for a period: the kit's total per day, by service, and by stack (kit tags).

Cost Explorer answers in us-east-1, bills $0.01 per request (every page), lags about a day, and sees a
user-defined tag only after it is activated for cost allocation (not retroactively). When no cost carries
`kit:project=<prefix>` the report says which of those is the likely cause instead of printing $0.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from fsdpkit.ops.aws import GLOBAL_BILLING_REGION, Aws
from fsdpkit.ops.tags import PROJECT_TAG, STACK_TAG

METRIC = "UnblendedCost"
ACTIVATE_HINT = (
    f"activate the tag {PROJECT_TAG} (and {STACK_TAG}) for cost allocation: Billing console -> "
    "Cost allocation tags -> select -> Activate; costs show from activation on (not retroactively), "
    "about 24 h later"
)


@dataclass(kw_only=True)
class Spend:
    start: dt.date
    end: dt.date
    """Exclusive, as in Cost Explorer."""
    total: float = 0.0
    """USD the kit's tag carries in the period."""
    untagged_total: float = 0.0
    """USD in the account without the kit:project tag (context, not the kit's)."""
    daily: dict[str, float] = field(default_factory=dict)
    by_service: dict[str, float] = field(default_factory=dict)
    by_stack: dict[str, float] = field(default_factory=dict)
    estimated: bool = False
    """True when some days are still estimates (Cost Explorer's lag)."""
    requests: int = 0
    """Cost Explorer requests made (each costs $0.01)."""
    hint: str = ""


def _pages(ce: Any, spend: Spend, **kwargs: Any) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    token = None
    while True:
        args = dict(kwargs, NextPageToken=token) if token else kwargs
        out = ce.get_cost_and_usage(**args)
        spend.requests += 1
        results.extend(out.get("ResultsByTime", []))
        token = out.get("NextPageToken")
        if not token:
            return results


def _amount(group: dict[str, Any]) -> float:
    return float(group.get("Metrics", {}).get(METRIC, {}).get("Amount", 0.0))


def get_spend(aws: Aws, prefix: str, start: dt.date, end: dt.date) -> Spend:
    ce = aws.client("ce", region=GLOBAL_BILLING_REGION)
    spend = Spend(start=start, end=end)
    period = {"Start": start.isoformat(), "End": end.isoformat()}
    tag_filter = {"Tags": {"Key": PROJECT_TAG, "Values": [prefix], "MatchOptions": ["EQUALS"]}}
    # 1. every cost grouped by the project tag: the kit's total per day, and whether the tag is active at all
    seen_values: set[str] = set()
    for day in _pages(
        ce,
        spend,
        TimePeriod=period,
        Granularity="DAILY",
        Metrics=[METRIC],
        GroupBy=[{"Type": "TAG", "Key": PROJECT_TAG}],
    ):
        spend.estimated |= bool(day.get("Estimated"))
        for g in day.get("Groups", []):
            value = g["Keys"][0].split("$", 1)[1] if "$" in g["Keys"][0] else ""
            if value:
                seen_values.add(value)
            if value == prefix:
                spend.daily[day["TimePeriod"]["Start"]] = spend.daily.get(
                    day["TimePeriod"]["Start"], 0.0
                ) + _amount(g)
            elif not value:
                spend.untagged_total += _amount(g)
    spend.total = sum(spend.daily.values())
    if prefix not in seen_values:
        if not seen_values:
            spend.hint = f"no cost in this period carries any {PROJECT_TAG} value: {ACTIVATE_HINT}"
        else:
            spend.hint = (
                f"no cost carries {PROJECT_TAG}={prefix} in this period (other values do: "
                f"{', '.join(sorted(seen_values)[:5])}); check --prefix and --period"
            )
        return spend  # the filtered calls below would only return nothing, at $0.01 each
    # 2. the kit's cost by service, 3. by stack (kit:stack)
    for key, target, type_ in (
        ("SERVICE", spend.by_service, "DIMENSION"),
        (STACK_TAG, spend.by_stack, "TAG"),
    ):
        sums: dict[str, float] = defaultdict(float)
        for month in _pages(
            ce,
            spend,
            TimePeriod=period,
            Granularity="MONTHLY",
            Metrics=[METRIC],
            Filter=tag_filter,
            GroupBy=[{"Type": type_, "Key": key}],
        ):
            for g in month.get("Groups", []):
                name = g["Keys"][0]
                if type_ == "TAG":
                    name = name.split("$", 1)[1] if "$" in name else name
                    name = name or f"(no {STACK_TAG} tag)"
                sums[name] += _amount(g)
        target.update(sorted(sums.items(), key=lambda kv: -kv[1]))
    if not spend.by_stack or set(spend.by_stack) == {f"(no {STACK_TAG} tag)"}:
        spend.hint = f"{STACK_TAG} is not split out: activate it for cost allocation too"
    return spend
