"""Prices: the Pricing API first (live), then the dated table `ops/prices.json` (labelled static, possibly
stale). A miss in both is reported as "no price"; a rate is never invented.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fsdpkit.ops.aws import Aws

TABLE_PATH = Path(__file__).resolve().parent.parent / "prices.json"


@dataclass(frozen=True)
class Price:
    usd: float | None
    """Price in USD per unit (None: unknown)."""
    unit: str
    source: str
    """'pricing-api', 'static table <as_of>' or 'none'."""


@cache
def table() -> dict[str, Any]:
    return json.loads(TABLE_PATH.read_text(encoding="utf-8"))


def static_source() -> str:
    return f"static table compiled {table()['as_of']}, unverified (possibly stale)"


def on_demand_filters(instance_type: str, region: str) -> list[dict[str, str]]:
    """Pin one SKU: Linux, shared tenancy, no pre-installed software, on demand, capacity actually used."""
    fields = {
        "instanceType": instance_type,
        "regionCode": region,
        "operatingSystem": "Linux",
        "preInstalledSw": "NA",
        "tenancy": "Shared",
        "capacitystatus": "Used",
        "licenseModel": "No License required",
        "marketoption": "OnDemand",
    }
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in fields.items()]


def parse_on_demand(price_list: list[str]) -> float | None:
    """USD per hour from GetProducts' PriceList (JSON strings); None when there is not exactly one rate."""
    rates = set()
    for item in price_list:
        product = json.loads(item)
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            for dim in term.get("priceDimensions", {}).values():
                usd = dim.get("pricePerUnit", {}).get("USD")
                if usd is not None and float(usd) > 0:
                    rates.add(float(usd))
    return rates.pop() if len(rates) == 1 else None


def ec2_hourly(aws: Aws | None, instance_type: str, region: str) -> Price:
    if aws is not None:
        import botocore.exceptions  # with an Aws session only: `make plan` prices offline without boto3

        from fsdpkit.ops.aws import GLOBAL_BILLING_REGION

        try:
            pricing = aws.client("pricing", region=GLOBAL_BILLING_REGION, max_attempts=2)
            out = pricing.get_products(
                ServiceCode="AmazonEC2", Filters=on_demand_filters(instance_type, region), MaxResults=10
            )
            usd = parse_on_demand(out.get("PriceList", []))
            if usd is not None:
                return Price(usd, "USD/h", "pricing-api")
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError, ValueError):
            pass  # fall back to the dated table below, labelled as such
    usd = table()["ec2_on_demand_usd_per_hour"].get(region, {}).get(instance_type)
    return Price(usd, "USD/h", static_source() if usd is not None else "none")


def gpus_per_instance(aws: Aws | None, instance_type: str) -> int | None:
    if aws is not None:
        import botocore.exceptions

        try:
            info = aws.client("ec2").describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"]
            gpus = sum(g.get("Count", 0) for g in info[0].get("GpuInfo", {}).get("Gpus", [])) if info else 0
            if gpus:
                return gpus
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError):
            pass
    return table()["gpus_per_instance"].get(instance_type)


def fsx_gb_month(region: str, deployment: str, throughput: int | None) -> Price:
    key = f"{deployment}/{throughput}" if deployment.startswith("PERSISTENT") else deployment
    usd = table()["fsx_lustre_usd_per_gb_month"].get(region, {}).get(key)
    return Price(usd, "USD/GB-month", static_source() if usd is not None else "none")


def ebs_gb_month(region: str, volume_type: str) -> Price:
    usd = table()["ebs_usd_per_gb_month"].get(region, {}).get(volume_type)
    return Price(usd, "USD/GB-month", static_source() if usd is not None else "none")


def hours_per_month() -> float:
    return float(table()["hours_per_month"])
