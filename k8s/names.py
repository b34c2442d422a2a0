"""Kubernetes naming rules (apimachinery's `validation` package), checked before anything reaches a cluster.

Each function returns None for a valid text, else the rule it breaks as a short phrase, so callers can put
it in their own one-line error that names the key. The API server enforces the same rules; checking here
means a bad label or name fails at render time, not after a p5 node was requested.
"""

from __future__ import annotations

import re

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")

LABEL_MAX = 63
SUBDOMAIN_MAX = 253

DNS1123_LABEL_RULE = (
    "a DNS-1123 label: at most 63 lower-case letters, digits and '-', alphanumeric at both ends"
)
DNS1123_SUBDOMAIN_RULE = (
    "a DNS-1123 subdomain: at most 253 characters, dot-separated DNS-1123 labels (lower-case letters, "
    "digits, '-')"
)
DNS1035_LABEL_RULE = (
    "a DNS-1035 label: at most 63 lower-case letters, digits and '-', starting with a letter, "
    "alphanumeric at the end"
)
QUALIFIED_NAME_RULE = (
    "a qualified name: an optional DNS-subdomain prefix (at most 253) and '/', then a name of at most 63 "
    "characters, [A-Za-z0-9] at both ends and '-', '_', '.' inside"
)
LABEL_VALUE_RULE = "empty, or at most 63 characters with [A-Za-z0-9] at both ends and '-', '_', '.' inside"


def _too_long(text: str, limit: int) -> str | None:
    return f"is {len(text)} characters (at most {limit})" if len(text) > limit else None


def dns1123_label(text: str) -> str | None:
    """Namespaces, Service and pod hostnames."""
    if too_long := _too_long(text, LABEL_MAX):
        return f"{too_long}; must be {DNS1123_LABEL_RULE}"
    return None if _DNS1123_LABEL.fullmatch(text) else f"must be {DNS1123_LABEL_RULE}"


def dns1123_subdomain(text: str) -> str | None:
    """Most object names (ConfigMap, PVC, PriorityClass, ServiceAccount) and label-key prefixes."""
    if too_long := _too_long(text, SUBDOMAIN_MAX):
        return f"{too_long}; must be {DNS1123_SUBDOMAIN_RULE}"
    return None if _DNS1123_SUBDOMAIN.fullmatch(text) else f"must be {DNS1123_SUBDOMAIN_RULE}"


def dns1035_label(text: str) -> str | None:
    """Service names (the Job's headless Service is named after the run id)."""
    if too_long := _too_long(text, LABEL_MAX):
        return f"{too_long}; must be {DNS1035_LABEL_RULE}"
    return None if _DNS1035_LABEL.fullmatch(text) else f"must be {DNS1035_LABEL_RULE}"


def qualified_name(key: str) -> str | None:
    """Label, annotation and node-selector keys: `[prefix/]name`."""
    prefix, slash, name = key.rpartition("/")
    if slash:
        if not prefix:
            return f"has an empty prefix before '/'; must be {QUALIFIED_NAME_RULE}"
        if "/" in prefix:
            return f"has more than one '/'; must be {QUALIFIED_NAME_RULE}"
        if len(prefix) > SUBDOMAIN_MAX:
            return (
                f"has a prefix of {len(prefix)} characters (at most {SUBDOMAIN_MAX}); "
                f"must be {QUALIFIED_NAME_RULE}"
            )
        if not _DNS1123_SUBDOMAIN.fullmatch(prefix):
            return f"has a prefix {prefix!r} that is not a DNS-1123 subdomain; must be {QUALIFIED_NAME_RULE}"
    if not name:
        return f"has an empty name; must be {QUALIFIED_NAME_RULE}"
    if len(name) > LABEL_MAX:
        return (
            f"has a name part of {len(name)} characters (at most {LABEL_MAX}); must be {QUALIFIED_NAME_RULE}"
        )
    return None if _QUALIFIED_NAME.fullmatch(name) else f"must be {QUALIFIED_NAME_RULE}"


def label_value(value: str) -> str | None:
    """Label values (and so node-selector values and the Kueue queue name)."""
    if too_long := _too_long(value, LABEL_MAX):
        return f"{too_long}; must be {LABEL_VALUE_RULE}"
    if value == "" or _QUALIFIED_NAME.fullmatch(value):
        return None
    return f"must be {LABEL_VALUE_RULE}"
