"""Where EKS's own container images live per region (used for the EFA device plugin image).

No CDK imports, so config validation can check the region before any construct exists.
"""

from __future__ import annotations

from fsdpkit.infra.errors import ConfigError

IMAGES_PAGE = "https://docs.aws.amazon.com/eks/latest/userguide/add-ons-images.html"
TABLE_DATE = "2026-12-01"
"""When EKS_IMAGE_ACCOUNTS was last copied from IMAGES_PAGE; a region added since is refused until added."""

EKS_IMAGE_ACCOUNTS: dict[str, str] = {
    # Copied from IMAGES_PAGE ("View Amazon container image registries for Amazon EKS add-ons") on 2026-12-01.
    "af-south-1": "877085696533",
    "ap-east-1": "800184023465",
    "ap-northeast-1": "602401143452",
    "ap-northeast-2": "602401143452",
    "ap-northeast-3": "602401143452",
    "ap-south-1": "602401143452",
    "ap-south-2": "900889452093",
    "ap-southeast-1": "602401143452",
    "ap-southeast-2": "602401143452",
    "ap-southeast-3": "296578399912",
    "ap-southeast-4": "491585149902",
    "ap-southeast-5": "151610086707",
    "ap-southeast-7": "121268973566",
    "ca-central-1": "602401143452",
    "ca-west-1": "761377655185",
    "cn-north-1": "918309763551",
    "cn-northwest-1": "961992271922",
    "eu-central-1": "602401143452",
    "eu-central-2": "900612956339",
    "eu-north-1": "602401143452",
    "eu-south-1": "590381155156",
    "eu-south-2": "455263428931",
    "eu-west-1": "602401143452",
    "eu-west-2": "602401143452",
    "eu-west-3": "602401143452",
    "il-central-1": "066635153087",
    "me-central-1": "759879836304",
    "me-south-1": "558608220178",
    "mx-central-1": "730335286997",
    "sa-east-1": "602401143452",
    "us-east-1": "602401143452",
    "us-east-2": "602401143452",
    "us-gov-east-1": "151742754352",
    "us-gov-west-1": "013241004608",
    "us-west-1": "602401143452",
    "us-west-2": "602401143452",
}
"""Region -> account of the EKS add-on image registry (IMAGES_PAGE)."""


def check_region(region: str) -> None:
    """ConfigError unless `region` is in EKS_IMAGE_ACCOUNTS (no silent guess of another region's account)."""
    if region not in EKS_IMAGE_ACCOUNTS:
        raise ConfigError(
            "region",
            f"{region!r} has no EKS image registry account in the kit's table (copied {TABLE_DATE}); add it "
            f"to infra/eks_images.py from {IMAGES_PAGE}, or set kubernetes.deploy_objects=false",
        )


def efa_plugin_repository(region: str) -> str:
    """The EFA device plugin image in the stack's own region (the chart defaults to us-west-2's registry,
    a cross-region pull that fails in partitions and regions without access to it)."""
    check_region(region)
    suffix = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"{EKS_IMAGE_ACCOUNTS[region]}.dkr.ecr.{region}.{suffix}/eks/aws-efa-k8s-device-plugin"
