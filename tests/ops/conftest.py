"""Fixtures for tests/ops: one moto server + fault proxy per session, reset before every test."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import boto3
import botocore.retries.standard
import pytest
from ops_fakeaws import LocalAws
from ops_realism import AwsRealism
from ops_world import World

REGION = "us-east-1"


@pytest.fixture(scope="session")
def local_aws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalAws]:
    aws = LocalAws.start()
    empty = tmp_path_factory.mktemp("awscfg") / "none"
    aws.env = {
        "AWS_ENDPOINT_URL": aws.proxy.url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        "AWS_CONFIG_FILE": str(empty),
        "AWS_SHARED_CREDENTIALS_FILE": str(empty),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    mp = pytest.MonkeyPatch()
    for k, v in aws.env.items():
        mp.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_PROFILE"):
        mp.delenv(k, raising=False)
    yield aws
    mp.undo()
    aws.stop()


@pytest.fixture
def fake_aws(local_aws: LocalAws, monkeypatch: pytest.MonkeyPatch) -> LocalAws:
    """A clean endpoint; botocore's throttling backoff at 0 s for in-process runs (a knob, not sleeps)."""
    local_aws.reset()
    monkeypatch.setattr(botocore.retries.standard.ExponentialBackoff, "delay_amount", lambda self, ctx: 0.0)
    return local_aws


@pytest.fixture
def world(fake_aws: LocalAws) -> World:
    """Clients to moto that bypass the fault rules, to seed and inspect state."""
    clients: dict[str, object] = {}

    def client(svc: str) -> object:
        if svc not in clients:
            clients[svc] = boto3.client(svc, endpoint_url=fake_aws.direct.url, region_name=REGION)
        return clients[svc]

    return World(client, region=REGION)


@pytest.fixture
def subprocess_env(local_aws: LocalAws) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(local_aws.env)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return env


logging.getLogger("werkzeug").setLevel(logging.ERROR)


@pytest.fixture
def realistic(fake_aws: LocalAws, world: World) -> AwsRealism:
    """AWS's refusals where moto is lenient (in-use SG / subnet / VPC, protected LB, stack DELETE_FAILED)."""
    return AwsRealism(fake_aws.proxy, world)
