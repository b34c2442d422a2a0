"""One boto3 session per command, clients with botocore's retry modes, and one-line errors.

Throttling (`Throttling`, `RequestLimitExceeded`, `SlowDown`, 5xx) is retried by botocore itself
(`retries={"mode": ..., "max_attempts": ...}`); dependency errors that botocore does not retry are handled by
`fsdpkit.ops.teardown.strategies`. The endpoint can be overridden with `AWS_ENDPOINT_URL` /
`AWS_ENDPOINT_URL_<SERVICE>` (botocore honours both
natively), which is how the tests point everything at a local moto server.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Literal

import boto3
import botocore.config
import botocore.exceptions

RetryMode = Literal["standard", "adaptive"]
GLOBAL_BILLING_REGION = "us-east-1"
"""Cost Explorer and the Pricing API answer in us-east-1 (Pricing also in eu-central-1, ap-south-1)."""


class OpsError(Exception):
    """A problem the user can fix; printed as one line (`error: ...`) without a traceback."""


@dataclass(frozen=True, kw_only=True)
class AwsSettings:
    """How ops talks to AWS."""

    region: str | None = None
    """AWS region of the kit's stacks; None = the session's default (AWS_REGION / profile)."""
    retry_mode: RetryMode = "adaptive"
    """botocore retry mode: `adaptive` adds client-side rate limiting on top of `standard`."""
    max_attempts: int = 10
    """Total attempts per call (first try included) for throttling and transient errors."""
    connect_timeout_s: float = 10.0
    """Seconds to open a connection."""
    read_timeout_s: float = 60.0
    """Seconds to wait for a response."""

    def __post_init__(self) -> None:
        if self.retry_mode not in ("standard", "adaptive"):
            raise OpsError(f"retry mode must be standard or adaptive, got {self.retry_mode!r}")
        if not 1 <= self.max_attempts <= 50:
            raise OpsError(f"max attempts must be 1..50, got {self.max_attempts}; 10 is a good default")


def known_regions(session: boto3.session.Session) -> set[str]:
    """Every region botocore knows in every partition (aws, aws-cn, aws-us-gov, ...)."""
    regions: set[str] = set()
    for partition in session.get_available_partitions():
        regions.update(session.get_available_regions("ec2", partition_name=partition))
    return regions


class Aws:
    """The session, the region, the account and cached clients for one command."""

    def __init__(self, settings: AwsSettings, *, require_credentials: bool = True) -> None:
        self.settings = settings
        try:
            # AWS_REGION (what the AWS CLI v2 and most SDKs read) is not read by boto3's session itself
            region_name = settings.region or os.environ.get("AWS_REGION") or None
            self.session = boto3.session.Session(region_name=region_name)
        except botocore.exceptions.ProfileNotFound as exc:
            raise OpsError(f"{exc}; fix AWS_PROFILE or run `aws configure --profile NAME`") from None
        region = self.session.region_name
        if not region:
            raise OpsError(
                "no AWS region: pass --region (e.g. --region us-east-1) "
                "or set AWS_REGION / AWS_DEFAULT_REGION"
            )
        if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", region) or region not in known_regions(self.session):
            raise OpsError(
                f"unknown AWS region {region!r}; pass a region name such as us-east-1 or eu-west-1 "
                "(if the region is new, upgrade boto3/botocore)"
            )
        self.region = region
        self._clients: dict[tuple[str, str, int | None], Any] = {}
        self._account: str | None = None
        if require_credentials and self.session.get_credentials() is None:
            raise OpsError(
                "no AWS credentials found; set AWS_PROFILE (after `aws sso login` / `aws configure`) "
                "or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            )

    def config(self, max_attempts: int | None = None) -> botocore.config.Config:
        return botocore.config.Config(
            retries={
                "mode": self.settings.retry_mode,
                "max_attempts": max_attempts or self.settings.max_attempts,
            },
            connect_timeout=self.settings.connect_timeout_s,
            read_timeout=self.settings.read_timeout_s,
            user_agent_extra="eks-fsdp-kit-ops",
        )

    def client(self, service: str, *, region: str | None = None, max_attempts: int | None = None) -> Any:
        """A cached client; `max_attempts=1` for calls whose failure means "not available here"."""
        key = (service, region or self.region, max_attempts)
        if key not in self._clients:
            self._clients[key] = self.session.client(
                service, region_name=key[1], config=self.config(max_attempts)
            )
        return self._clients[key]

    def account_id(self) -> str:
        """The account the credentials belong to (STS), cached; auth failures become one-line errors."""
        if self._account is None:
            try:
                self._account = str(self.client("sts").get_caller_identity()["Account"])
            except botocore.exceptions.NoCredentialsError:
                raise OpsError(
                    "no AWS credentials found; set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
                ) from None
            except botocore.exceptions.ClientError as exc:
                raise OpsError(
                    f"AWS rejected the credentials ({error_code(exc)}: {error_message(exc)}); "
                    "refresh them (e.g. `aws sso login`) and retry"
                ) from None
            except botocore.exceptions.EndpointConnectionError as exc:
                raise OpsError(f"cannot reach AWS ({exc}); check the network or AWS_ENDPOINT_URL") from None
        return self._account


def error_code(exc: BaseException) -> str:
    """The AWS error code of a ClientError ('' for anything else)."""
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def error_message(exc: BaseException) -> str:
    """The AWS error message on one line."""
    if isinstance(exc, botocore.exceptions.ClientError):
        msg = str(exc.response.get("Error", {}).get("Message", "")) or str(exc)
    else:
        msg = str(exc)
    return " ".join(msg.split())


def describe_error(exc: BaseException) -> str:
    """`Code: message` for reports."""
    code = error_code(exc)
    msg = error_message(exc)
    return f"{code}: {msg}" if code else msg
