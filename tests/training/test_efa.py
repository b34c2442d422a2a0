"""EFA proof at start: recorded outputs of fi_info and NCCL (tests/training/fixtures/efa/README.md)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from trainer_helpers import TINY, run_trainer

from fsdpkit.runtime.efa import EfaError, check_fabric, check_nccl_log, efa_devices, nccl_network
from fsdpkit.runtime.events import read_events

FIX = Path(__file__).parent / "fixtures" / "efa"


def read(name: str) -> str:
    return (FIX / name).read_text()


def test_legacy_listing_counts_the_rdm_domain_once_and_not_the_rxd_utility():
    assert efa_devices(read("fi_info_efa1_legacy.txt")) == ["efa_0"]


def test_efa_direct_and_efa_fabrics_count_each_device_once():
    assert efa_devices(read("fi_info_efa4_direct.txt")) == [
        "rdmap16s27",
        "rdmap32s27",
        "rdmap144s27",
        "rdmap160s27",
    ]


def test_no_devices_output_counts_zero():
    assert efa_devices(read("fi_info_no_devices.txt")) == []


def test_nccl_over_efa_is_recognised():
    net = nccl_network(read("nccl_efa.log"))
    assert (net.network, net.provider, net.nics, net.fallback) == ("Libfabric", "efa", 32, None)
    assert net.on_efa


def test_socket_fallback_is_recognised():
    net = nccl_network(read("nccl_socket_fallback.log"))
    assert net.network == "Socket" and net.provider is None and not net.on_efa
    assert "No eligible providers" in net.fallback


def fake_fi_info(tmp_path: Path, fixture: str) -> str:
    """A stand-in for the external tool: prints a recorded output, as `fi_info` would on that node."""
    exe = tmp_path / "fi_info"
    exe.write_text(f"#!/bin/sh\ncat '{FIX / fixture}'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return os.fspath(exe)


def test_check_fabric_passes_with_enough_devices(tmp_path):
    assert len(check_fabric(4, fake_fi_info(tmp_path, "fi_info_efa4_direct.txt"))) == 4


@pytest.mark.parametrize(
    ("fixture", "expected", "msg"),
    [
        ("fi_info_no_devices.txt", 32, r"sees 0 EFA devices, the profile expects 32 \(fi_info said '-61'\)"),
        ("fi_info_efa4_direct.txt", 32, r"sees 4 EFA devices, the profile expects 32: request"),
    ],
)
def test_check_fabric_refuses_too_few_devices(tmp_path, fixture, expected, msg):
    with pytest.raises(EfaError, match=msg) as exc:
        check_fabric(expected, fake_fi_info(tmp_path, fixture))
    assert "\n" not in str(exc.value)


def test_check_fabric_without_the_tool_says_what_to_install(tmp_path):
    with pytest.raises(EfaError, match="is not installed in the image"):
        check_fabric(32, os.fspath(tmp_path / "no-such-fi_info"))


def test_check_nccl_log(tmp_path):
    good, bad = tmp_path / "good.log", tmp_path / "bad.log"
    good.write_text(read("nccl_efa.log"))
    bad.write_text(read("nccl_socket_fallback.log"))
    assert check_nccl_log(good, 32).nics == 32
    with pytest.raises(EfaError, match=r"NCCL is not using EFA .*No eligible providers"):
        check_nccl_log(bad, 32)
    with pytest.raises(EfaError, match="found 32 EFA NICs, the profile expects 64"):
        check_nccl_log(good, 64)
    with pytest.raises(EfaError, match="no NCCL debug log at"):
        check_nccl_log(tmp_path / "missing.log", 32)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fixture", "code"), [("fi_info_efa4_direct.txt", 0), ("fi_info_no_devices.txt", 78)]
)
def test_trainer_refuses_to_train_without_its_efa_devices(tmp_path, fixture, code):
    """Both ranks learn the verdict of local rank 0 and exit 78 together, before the first step."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_fi_info(bin_dir, fixture)
    root = tmp_path / "runs"
    args = ["--run.id", "efa", "--run.root", str(root), *TINY, "--training.steps", "2",
            "--checkpoint.mode", "off", "--training.efa_devices", "4"]  # fmt: skip
    out = run_trainer(tmp_path, args, env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert out.returncode == (0 if code == 0 else 1), out.stderr  # torchrun reports a failed worker as 1
    steps = [e for e in read_events(root / "efa") if e["kind"] == "step"]
    if code:
        assert "error: libfabric sees 0 EFA devices, the profile expects 4" in out.stderr
        assert "exitcode  : 78" in out.stderr or "exitcode: 78" in out.stderr.replace(" ", "")
        assert steps == []
    else:
        assert len(steps) == 4  # 2 steps x 2 ranks
