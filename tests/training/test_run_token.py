"""The run's token (fsdpkit.runtime.run_token): read from KIT_RUN_TOKEN_FILE, the seals and scopes derived
from it; the stores a local run serves listen on the loopback address only; the in-process restart's report
exchange is JSON (a peer's bytes are never unpickled)."""

from __future__ import annotations

import base64
import os
import pickle
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous.api import RendezvousStateError

from fsdpkit.contracts import exitcodes
from fsdpkit.contracts.env import RUN_TOKEN_FILE
from fsdpkit.launcher.rendezvous.c10d import SealedC10dBackend
from fsdpkit.resilience.recovery import Report, exchange_reports, report_from_json, report_to_json
from fsdpkit.runtime.distributed import serve_store
from fsdpkit.runtime.run_token import RunKey, RunTokenError, read_token

REPO = Path(__file__).resolve().parents[2]
TOKEN = "ab" * 32


def _token_file(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "token"
    path.write_text(text, encoding="ascii")
    return {RUN_TOKEN_FILE: str(path)}


def test_the_token_is_64_hex_digits_with_an_optional_newline_and_none_when_unset_or_absent(
    tmp_path: Path,
) -> None:
    assert read_token({}) is None
    assert read_token({RUN_TOKEN_FILE: str(tmp_path / "absent")}) is None
    assert read_token(_token_file(tmp_path, TOKEN)) == bytes.fromhex(TOKEN)
    assert read_token(_token_file(tmp_path, TOKEN + "\n")) == bytes.fromhex(TOKEN)
    for bad in ("ab" * 31, TOKEN + "\n\n", "zz" * 32, ""):
        with pytest.raises(RunTokenError, match=rf"{RUN_TOKEN_FILE}=.*token: holds \d+ characters, not 64"):
            read_token(_token_file(tmp_path, bad))


def test_a_seal_checks_only_with_the_same_token_and_the_same_key() -> None:
    key, other = RunKey(bytes.fromhex(TOKEN)), RunKey(os.urandom(32))
    sealed = key.seal("kit-rdzv/t/beat/n1", "left")
    assert key.open("kit-rdzv/t/beat/n1", sealed) == "left"
    assert key.open("kit-rdzv/t/beat/n2", sealed) is None  # a genuine record copied to another key
    assert key.open("kit-rdzv/t/beat/n1", "left") is None  # no tag
    assert key.open("kit-rdzv/t/beat/n1", other.seal("kit-rdzv/t/beat/n1", "left")) is None  # a wrong token
    assert key.refused() == {"kit-rdzv/t/beat/n1", "kit-rdzv/t/beat/n2"}
    assert key.scope("rdzv/t") != other.scope("rdzv/t") and key.scope("rdzv/t") != key.scope("workers")
    assert len(key.scope("rdzv/t")) == 32 and key.scoped("kit/", "workers") == f"kit/{key.scope('workers')}/"


def test_without_a_token_the_kit_behaves_as_before() -> None:
    none = RunKey(None)
    assert (
        not none.enabled
        and none.scope("rdzv/t") == ""
        and none.scoped("kit-rdzv/t/", "rdzv/t") == "kit-rdzv/t/"
    )
    assert none.seal("k", "v") == "v" and none.open("k", "v") == "v"


def test_the_launcher_refuses_a_token_file_that_is_not_a_token_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), **_token_file(tmp_path, "not a token")}
    proc = subprocess.run(
        [sys.executable, "-m", "fsdpkit.launcher", "--standalone", "-m", "fsdpkit.trainer"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == exitcodes.FATAL_CONFIG
    assert f"kit-launch: error: {RUN_TOKEN_FILE}=" in proc.stderr and "not 64 hex digits" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def _listening(port: int) -> set[str]:
    mine = psutil.Process().net_connections(kind="tcp")
    return {c.laddr.ip for c in mine if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def test_a_store_on_a_loopback_host_listens_there_only() -> None:
    """torch's TCPStore listens on every interface whatever host it is given; serve_store binds it."""
    store = serve_store("127.0.0.1", 0, timeout=timedelta(seconds=10))
    assert _listening(store.port) == {"127.0.0.1"}
    client = dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10))
    client.set("k", "v")
    assert store.get("k") == b"v"
    wide = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )
    assert _listening(wide.port) & {"0.0.0.0", "::"}  # what serve_store is for


class _Plant:
    """Unpickling this creates a marker file: a peer's bytes that would run code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (open, (str(self.marker), "w"))


def test_the_in_process_report_exchange_is_json_and_refuses_anything_else(tmp_path: Path) -> None:
    report = Report(live=7, why=None, memory=5, committed=4)
    assert report_to_json(report) == b'{"committed":4,"live":7,"memory":5,"portable":true,"why":null}'
    assert report_from_json(report_to_json(report)) == report
    marker = tmp_path / "ran"
    with pytest.raises(ValueError, match=r"utf-8|Expecting value"):
        report_from_json(pickle.dumps(_Plant(marker)))
    assert not marker.exists()
    for bad in (b'{"live": 7}', b'{"committed":4,"live":true,"memory":5,"why":null}', b"[1, 2]"):
        with pytest.raises(ValueError, match="restore report"):
            report_from_json(bad)
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        assert exchange_reports(report) == [report]  # over a real gloo group: lengths, then the bytes
    finally:
        dist.destroy_process_group()


def test_a_c10d_state_without_the_runs_token_is_refused_before_torch_decodes_it(tmp_path: Path) -> None:
    """torch's c10d rendezvous state is a pickle every agent decodes: a stranger that finds its key (TCPStore
    lists them) and writes a payload there must not run it."""
    store = serve_store("127.0.0.1", 0, timeout=timedelta(seconds=10))
    backend = SealedC10dBackend(store, "job", RunKey(os.urandom(32)))
    assert backend.get_state() is None
    state, token, ok = backend.set_state(b"the state")  # type: ignore[misc]
    assert ok and state == b"the state" and backend.get_state() == (b"the state", token)
    (key,) = [k for k in store.list_keys() if k.startswith("torch.rendezvous.job/")]
    marker = tmp_path / "ran"
    store.set(key, base64.b64encode(pickle.dumps(_Plant(marker))))
    with pytest.raises(RendezvousStateError, match="does not carry the run's token: refused, not decoded"):
        backend.get_state()
    with pytest.raises(RendezvousStateError, match="refused"):
        backend.set_state(b"the state", token)
    assert not marker.exists()
