"""Proof that NCCL runs over EFA: checked before training on a node whose profile expects EFA devices.

EFA silently falling back to TCP sockets is the most reported problem in AWS's distributed-training samples:
the job runs, about ten times slower, and nobody notices. Two facts prove the fabric, and both come from the
tools themselves, not from the kit's own settings:
- libfabric sees the node's EFA devices: `fi_info -p efa -t FI_EP_RDM` lists one RDM domain per device (it
  prints `-61`, "No data available", when the container does not see /dev/infiniband; aws/aws-ofi-nccl#1020);
- NCCL chose the aws-ofi-nccl plugin with the EFA provider: with `NCCL_DEBUG=INFO` (subsystems INIT,NET) it
  logs `NET/OFI Selected Provider is efa (found N nics)` and `Using network Libfabric` (older plugins: `AWS
  Libfabric`); a fallback logs `NET/OFI aws-ofi-nccl initialization failed`, `Initialized NET plugin Socket`
  or `Using network Socket` (NVIDIA/nccl#1597, #229; aws-samples/aws-do-eks#54).
Standard library only: the trainer calls it; tests feed it recorded outputs of both tools.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

FI_INFO_TIMEOUT_S = 60.0

_DOMAIN = re.compile(r"^\s*domain:\s*(\S+)\s*$")
_PROVIDER = re.compile(r"^\s*provider:\s*(\S+)\s*$")
_TYPE = re.compile(r"^\s*type:\s*(\S+)\s*$")
_SELECTED = re.compile(r"NET/OFI Selected [Pp]rovider is (\S+?),?(?: fabric is \S+)? \(found (\d+) nics?\)")
_USING = re.compile(r"Using network (.+?)\s*$")
_FALLBACK = (
    "aws-ofi-nccl initialization failed",
    "Could not find any optimal provider",
    "No eligible providers were found",
    "Initialized NET plugin Socket",
)


class EfaError(RuntimeError):
    """The node would not train over EFA although its profile expects it; one line that says the fix."""


def efa_devices(fi_info_output: str) -> list[str]:
    """Distinct EFA devices in `fi_info -p efa` output: RDM domains of the efa provider, suffix stripped.

    Newer libfabric lists each device twice (fabrics `efa` and `efa-direct`); a device counts once.
    """
    devices: list[str] = []
    provider = domain = None
    for line in fi_info_output.splitlines():
        if m := _PROVIDER.match(line):
            provider, domain = m.group(1), None
        elif m := _DOMAIN.match(line):
            domain = m.group(1)
        elif (m := _TYPE.match(line)) and m.group(1) == "FI_EP_RDM" and provider == "efa" and domain:
            name = domain.removesuffix("-rdm")
            if name not in devices:
                devices.append(name)
    return devices


@dataclass(frozen=True)
class NcclNet:
    """What NCCL's own log says about the network it chose."""

    network: str | None
    """The `Using network X` name (Libfabric / AWS Libfabric / Socket / IB), None if not logged."""
    provider: str | None
    """The libfabric provider aws-ofi-nccl selected (efa), None if it did not select one."""
    nics: int
    """NICs the provider found (0 if none logged)."""
    fallback: str | None
    """The first line that says the plugin failed and NCCL fell back, if any."""

    @property
    def on_efa(self) -> bool:
        return self.provider == "efa" and "libfabric" in (self.network or "").lower() and not self.fallback


def nccl_network(log_text: str) -> NcclNet:
    network = provider = fallback = None
    nics = 0
    for line in log_text.splitlines():
        if m := _SELECTED.search(line):
            provider, nics = m.group(1), int(m.group(2))
        if m := _USING.search(line):
            network = m.group(1)
        if fallback is None and any(marker in line for marker in _FALLBACK):
            fallback = line.strip()
    return NcclNet(network=network, provider=provider, nics=nics, fallback=fallback)


def check_fabric(expected: int, fi_info: str = "fi_info") -> list[str]:
    """Run `fi_info -p efa -t FI_EP_RDM` and require `expected` EFA devices; returns their names."""
    try:
        proc = subprocess.run(
            [fi_info, "-p", "efa", "-t", "FI_EP_RDM"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=FI_INFO_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError:
        raise EfaError(
            f"EFA expected ({expected} devices) but {fi_info!r} is not installed in the image: install the "
            "EFA software (aws-efa-installer) in the trainer image, or set training.efa_devices=0 to train "
            "without EFA"
        ) from None
    except subprocess.TimeoutExpired:
        raise EfaError(f"{fi_info} -p efa did not answer within {FI_INFO_TIMEOUT_S:.0f} s") from None
    found = efa_devices(proc.stdout)
    if len(found) < expected:
        said = (proc.stdout.strip() or proc.stderr.strip()).splitlines()
        tail = f" (fi_info said {said[-1][:80]!r})" if said and not found else ""
        raise EfaError(
            f"libfabric sees {len(found)} EFA devices, the profile expects {expected}{tail}: request "
            f"vpc.amazonaws.com/efa: {expected} in the pod and check the EFA device plugin on the node "
            "(NCCL would fall back to TCP sockets); training.efa_devices=0 skips this check"
        )
    return found


def prepare_nccl_log() -> None:
    """Create the folder of NCCL_DEBUG_FILE before NCCL opens it (NCCL does not create folders)."""
    pattern = os.environ.get("NCCL_DEBUG_FILE", "")
    if pattern:
        Path(pattern).parent.mkdir(parents=True, exist_ok=True)


def nccl_log_path() -> Path:
    """This process's NCCL debug log: NCCL_DEBUG_FILE with NCCL's %h (host) and %p (pid) filled in."""
    pattern = os.environ.get("NCCL_DEBUG_FILE", "")
    if not pattern or os.environ.get("NCCL_DEBUG", "").upper() not in ("INFO", "TRACE"):
        raise EfaError(
            "the EFA check reads NCCL's own log: set NCCL_DEBUG=INFO and NCCL_DEBUG_FILE (the p5 profile "
            "does); training.efa_devices=0 skips the check"
        )
    return Path(pattern.replace("%h", socket.gethostname()).replace("%p", str(os.getpid())))


def check_nccl_log(path: Path, expected_nics: int) -> NcclNet:
    """Read this process's NCCL debug log after the first collective and require aws-ofi-nccl over EFA."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise EfaError(
            f"no NCCL debug log at {path} ({exc.strerror}): the check needs NCCL_DEBUG=INFO and "
            "NCCL_DEBUG_FILE"
        ) from None
    net = nccl_network(text)
    if not net.on_efa:
        why = net.fallback or f"network {net.network or 'not logged'}, provider {net.provider or 'none'}"
        raise EfaError(
            f"NCCL is not using EFA ({why[:120]}): check that the image has aws-ofi-nccl on LD_LIBRARY_PATH "
            "and FI_PROVIDER=efa; training.efa_devices=0 trains anyway (slow, for debugging only)"
        )
    if net.nics < expected_nics:
        raise EfaError(
            f"aws-ofi-nccl found {net.nics} EFA NICs, the profile expects {expected_nics}: check the pod's "
            "vpc.amazonaws.com/efa request"
        )
    return net
