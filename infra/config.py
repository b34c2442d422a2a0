"""Typed kit settings, read from `cdk.json` context and `-c key=value` overrides, validated once.

Keys are `section.field` (e.g. `gpu.instance_type`) plus the top-level `prefix`, `account`, `region`
and `nag`. `-c` beats `cdk.json` (the CDK CLI merges them before the app starts). Values from `-c` arrive
as strings and are parsed by the field's type: integers, `true`/`false`, comma-separated or JSON lists,
`null` for "unset". Unknown kit-looking keys are errors, so a typo never silently falls back to a default.

The sections and their within-section rules (`__post_init__`) live in `fsdpkit.infra.sections`, re-exported
here; rules across sections live in `fsdpkit.infra.validation`, which `KitConfig.__post_init__` runs. A
`KitConfig` that exists is valid.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fsdpkit.infra import validation
from fsdpkit.infra.errors import ConfigError, require
from fsdpkit.infra.sections import (
    CHECKPOINT_WRITE_S_MAX,
    FSX_DEFAULT_THROUGHPUT_PER_TIB,
    FSX_THROUGHPUT_PER_TIB,
    LOG_RETENTION_DAYS,
    MANAGED_NODE_GROUP_MAX_NODES,
    REPAIR_ACTIONS,
    REPAIR_CONDITIONS,
    Capacity,
    ClusterConfig,
    ControlPlaneLog,
    DeploymentType,
    EndpointAccess,
    GpuConfig,
    KubernetesConfig,
    KubernetesVersion,
    MonitoringConfig,
    NetworkConfig,
    RegistryConfig,
    RepairAction,
    RepairOverride,
    StorageConfig,
    parse_repair_override,
)

__all__ = [
    "CHECKPOINT_WRITE_S_MAX",
    "FSX_DEFAULT_THROUGHPUT_PER_TIB",
    "FSX_THROUGHPUT_PER_TIB",
    "LOG_RETENTION_DAYS",
    "MANAGED_NODE_GROUP_MAX_NODES",
    "REPAIR_ACTIONS",
    "REPAIR_CONDITIONS",
    "SECTIONS",
    "Capacity",
    "ClusterConfig",
    "ControlPlaneLog",
    "DeploymentType",
    "EndpointAccess",
    "GpuConfig",
    "KitConfig",
    "KubernetesConfig",
    "KubernetesVersion",
    "MonitoringConfig",
    "NetworkConfig",
    "RegistryConfig",
    "RepairAction",
    "RepairOverride",
    "StorageConfig",
    "known_keys",
    "load_config",
    "parse_repair_override",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class KitConfig:
    """Every setting of the CDK app. Built by `load_config`; valid once constructed."""

    account: str
    """AWS account id (12 digits) the stacks deploy to; the committed placeholder synthesizes offline."""
    region: str
    """AWS region, e.g. `us-west-2`; `network.availability_zones` must belong to it."""
    network: NetworkConfig
    """VPC settings (`network.*`)."""
    gpu: GpuConfig
    """GPU node group settings (`gpu.*`)."""
    prefix: str = "fsdp-kit"
    """Name prefix of stacks and resources, and the value of the `kit:project` tag (2-20 chars, a-z 0-9 -)."""
    nag: bool = False
    """Run the cdk-nag AwsSolutions checks during synth (findings fail the synth; `make lint` sets it)."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """EKS control plane and system node group settings (`cluster.*`)."""
    storage: StorageConfig = field(default_factory=StorageConfig)
    """FSx for Lustre settings (`storage.*`)."""
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    """ECR repository settings (`registry.*`)."""
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)
    """Kubernetes objects installed by CDK (`kubernetes.*`)."""
    monitoring: MonitoringConfig = field(default_factory=MonitoringConfig)
    """Training dashboard, alarms and alarm topic (`monitoring.*`)."""

    def __post_init__(self) -> None:
        require(
            bool(re.match(r"^[a-z][a-z0-9-]{0,18}[a-z0-9]$", self.prefix)),
            "prefix",
            f"{self.prefix!r} is not allowed; use 2-20 characters a-z, 0-9, '-', starting with a letter",
        )
        require(
            bool(re.match(r"^\d{12}$", self.account)),
            "account",
            f"{self.account!r} is not a 12-digit account id",
        )
        require(
            bool(re.match(r"^[a-z]{2}(-gov)?-[a-z]+-\d$", self.region)),
            "region",
            f"{self.region!r} is not a region name like 'us-west-2'",
        )
        validation.check_cross_rules(
            region=self.region,
            network=self.network,
            gpu=self.gpu,
            cluster=self.cluster,
            kubernetes=self.kubernetes,
            storage=self.storage,
        )


SECTIONS: dict[str, type] = {
    "network": NetworkConfig,
    "cluster": ClusterConfig,
    "gpu": GpuConfig,
    "storage": StorageConfig,
    "registry": RegistryConfig,
    "kubernetes": KubernetesConfig,
    "monitoring": MonitoringConfig,
}
_KIT_KEY_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)?$")
_NULLS = {"null", "none", ""}


def known_keys() -> list[str]:
    """Every context key the kit reads, `section.field` or top-level."""
    keys = [f.name for f in dataclasses.fields(KitConfig) if f.name not in SECTIONS]
    for section, cls in SECTIONS.items():
        keys += [f"{section}.{f.name}" for f in dataclasses.fields(cls)]
    return keys


def _parse(key: str, raw: Any, hint: Any) -> Any:
    """Turn a context value (JSON from cdk.json, or a string from -c) into the field's type."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if isinstance(raw, str) and raw and not raw.strip():
            raise ConfigError(key, f"{raw!r} is only whitespace; give a value, or null to unset it")
        if raw is None or (isinstance(raw, str) and raw.strip().lower() in _NULLS):
            return None
        return _parse(key, raw, inner[0])
    if raw is None:
        raise ConfigError(key, "must not be null")
    if origin is Literal:
        value = str(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else raw
        if value not in args:
            raise ConfigError(key, f"{raw!r} is not allowed; use one of: " + ", ".join(map(str, args)))
        return value
    if origin is tuple:
        if isinstance(raw, str):
            text = raw.strip()
            if text.startswith("["):
                try:
                    raw = json.loads(text)
                except json.JSONDecodeError:
                    raise ConfigError(key, f"{raw!r} is not a JSON list") from None
            else:
                raw = [part.strip() for part in text.split(",") if part.strip()]
        if not isinstance(raw, list | tuple):
            raise ConfigError(key, f"{raw!r} is not a list; give a JSON list or comma-separated values")
        return tuple(_parse(key, item, args[0]) for item in raw)
    if hint is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
            return raw.strip().lower() == "true"
        raise ConfigError(key, f"{raw!r} is not a boolean; use true or false")
    if hint is int:
        if isinstance(raw, bool):
            raise ConfigError(key, f"{raw!r} is not an integer")
        if isinstance(raw, int):
            return raw
        if isinstance(raw, str) and re.match(r"^-?\d+$", raw.strip()):
            return int(raw.strip())
        raise ConfigError(key, f"{raw!r} is not an integer")
    if hint is str:
        if isinstance(raw, str):
            return raw.strip()
        raise ConfigError(key, f"{raw!r} is not a string")
    raise TypeError(f"config field {key} has an unsupported type {hint!r}")  # a bug in this module, not input


def _build(cls: type, prefix: str, values: Mapping[str, Any]) -> Any:
    """Construct one dataclass from the context values whose keys start with `prefix`."""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in SECTIONS and cls is KitConfig:
            kwargs[f.name] = _build(SECTIONS[f.name], f"{f.name}.", values)
            continue
        key = f"{prefix}{f.name}"
        if key in values:
            kwargs[f.name] = _parse(key, values[key], hints[f.name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(key, f"required; set it in cdk.json context or with -c {key}=...")
    return cls(**kwargs)


def load_config(context: Mapping[str, Any]) -> KitConfig:
    """Build and validate the KitConfig from CDK context (cdk.json merged with -c overrides).

    Keys that look like kit keys (`name` or `section.name`, lowercase) but are unknown are rejected with the
    closest known key; CDK's own keys (feature flags, `aws:cdk:*`, AZ lookups) contain `@`, `:` or `-`.
    """
    known = known_keys()
    for key in context:
        if _KIT_KEY_RE.match(key) and key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "see docs/infra.md for the keys"
            raise ConfigError(key, f"unknown setting; {hint}")
    cfg: KitConfig = _build(KitConfig, "", context)
    validation.check_known_azs(
        account=cfg.account,
        region=cfg.region,
        network=cfg.network,
        known=context.get(validation.az_context_key(cfg.account, cfg.region)),
    )
    return cfg
