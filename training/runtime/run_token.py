"""The run's secret, and what the kit's stores derive from it (issue 49: the control plane refuses strangers).

TCPStore has no authentication: any client that reaches its port may read, write and delete every key, and
torch 2.13 lists the keys (`Store.list_keys`), so a key name alone is no secret. The run's token (32 random
bytes in a file only the run's pods mount, `KIT_RUN_TOKEN_FILE`) gives two things:
- a scope per purpose (`RunKey.scope`): key names under HMAC-SHA256(token, purpose), so runs sharing a store
  never meet and a client without the token cannot know the names before the run writes them;
- a seal per record (`RunKey.seal`/`open`): each value the kit reads back carries an HMAC tag over its key and
  its bytes, so a forged value, or a genuine one copied to another key, fails the check and is ignored.
Without a token (unset, or no file) every scope is empty and every seal is the value itself: the kit behaves
as before issue 49, and the launcher says so once.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from fsdpkit.contracts.env import RUN_TOKEN_FILE

log = logging.getLogger("kit.launch")

TOKEN_HEX = 64
"""The token file's characters: 32 random bytes as hex, optionally followed by a newline."""
TAG_SEP = " #"
"""Between a sealed value and its tag (hex, TAG_HEX characters)."""
TAG_HEX = 32
"""A tag's hex characters: HMAC-SHA256 truncated to 128 bits (RFC 2104 s5 allows truncation to >= 80)."""


class RunTokenError(ValueError):
    """The token file exists but is not a token: a one-line error for the user."""


def read_token(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The run's token from the file `KIT_RUN_TOKEN_FILE` names; None when unset or the file is absent."""
    env = os.environ if environ is None else environ
    path = env.get(RUN_TOKEN_FILE, "")
    if not path:
        return None
    try:
        text = Path(path).read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise RunTokenError(
            f"{RUN_TOKEN_FILE}={path}: cannot read the run's token ({exc}); fix the file"
        ) from exc
    body = text[:-1] if text.endswith("\n") else text
    try:
        if len(body) != TOKEN_HEX:
            raise ValueError(body)
        return bytes.fromhex(body)
    except ValueError:
        raise RunTokenError(
            f"{RUN_TOKEN_FILE}={path}: holds {len(body)} characters, not {TOKEN_HEX} hex digits (32 random "
            'bytes); write one with: python -c "import secrets; print(secrets.token_hex(32))"'
        ) from None


class RunKey:
    """The keys the kit derives from the run's token; with none, the identity (the kit as before)."""

    def __init__(self, token: bytes | None) -> None:
        self._token = token
        self._mac = hmac.new(token, b"fsdpkit/seal", hashlib.sha256).digest() if token else b""
        self._refused: set[str] = set()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RunKey:
        """The run's key from `KIT_RUN_TOKEN_FILE` (RunTokenError when the file is not a token)."""
        return cls(read_token(environ))

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def scope(self, purpose: str) -> str:
        """A key-name scope for `purpose` (32 hex characters), or "" without a token."""
        if self._token is None:
            return ""
        return hmac.new(self._token, b"fsdpkit/scope/" + purpose.encode(), hashlib.sha256).hexdigest()[:32]

    def scoped(self, prefix: str, purpose: str) -> str:
        """`prefix` with this run's scope for `purpose` appended as one more path element ("a/" -> "a/S/")."""
        scope = self.scope(purpose)
        return f"{prefix}{scope}/" if scope else prefix

    def _tag(self, key: str, value: str) -> str:
        return self._mac_of(key, value.encode()).hex()[:TAG_HEX]

    def seal(self, key: str, value: str) -> str:
        """`value` as stored under `key`: with its tag (bound to the key), or unchanged without a token."""
        if self._token is None:
            return value
        return f"{value}{TAG_SEP}{self._tag(key, value)}"

    def open(self, key: str, stored: str) -> str | None:
        """The value a sealed record under `key` holds, or None when its tag does not check (a record written
        without the run's token: logged once per key). Without a token: `stored` itself."""
        if self._token is None:
            return stored
        value, sep, tag = stored.rpartition(TAG_SEP)
        if sep and len(tag) == TAG_HEX and hmac.compare_digest(tag, self._tag(key, value)):
            return value
        self._say_refused(key)
        return None

    def _say_refused(self, key: str) -> None:
        if key not in self._refused:
            self._refused.add(key)
            log.warning(
                "kit-launch: ignored the record at %s: it does not carry the run's token (written by a "
                "client outside the run)",
                key,
            )

    def _mac_of(self, key: str, value: bytes) -> bytes:
        return hmac.new(self._mac, key.encode() + b"\0" + value, hashlib.sha256).digest()

    def refused(self) -> set[str]:
        """The keys whose records were ignored (forged), for tests and the log."""
        return set(self._refused)


NO_KEY = RunKey(None)
"""The identity key: a store used without a token."""


_KEYS: dict[str, RunKey] = {}
"""The run key per token file path (a process reads its file once)."""
_SAID: set[str] = set()
"""The token file paths whose absence this process has already logged."""


def run_key(*, say: bool = False) -> RunKey:
    """This process's run key from `KIT_RUN_TOKEN_FILE`, read once. `say`: the launcher's call, which logs
    once when there is no token (the stores then accept any client that reaches them). RunTokenError when
    the file is not a token."""
    path = os.environ.get(RUN_TOKEN_FILE, "")
    key = _KEYS.get(path)
    if key is None:
        key = _KEYS[path] = RunKey.from_env()
    if say and not key.enabled and path not in _SAID:
        _SAID.add(path)
        log.warning(
            "kit-launch: no run token (%s %s): the rendezvous and the workers' stores accept any client "
            "that reaches their ports (docs/security.md)",
            RUN_TOKEN_FILE,
            f"names {path}, which does not exist" if path else "is not set",
        )
    return key
