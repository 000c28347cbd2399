"""API keys and ownership. A key is the SDK's ``tml-...`` string; each key is one tenant, named by a short
digest of it (its ``owner``), and sees only what it created: sessions, models, samplers, checkpoints and
request results of another owner answer "not found".

Keys come from a file (one a line; blank lines and ``#`` comments skipped) or from the environment variable
``AGENTRL_TINKER_API_KEYS`` (comma-separated). With neither, the server is open: any ``tml-`` key is accepted
and is its own tenant (allowed on a loopback address only, see :func:`check_open`)."""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable
from pathlib import Path

from agentrl.core.errors import ConfigError
from agentrl.tinker.errors import TinkerAuthError

KEYS_ENV = "AGENTRL_TINKER_API_KEYS"
PREFIX = "tml-"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class KeyFileError(ConfigError, ValueError):
    """The API key file (or variable) cannot be used: unreadable, empty, or a key without the ``tml-`` prefix."""

    code = "config.tinker_keys"


def owner_of(key: str) -> str:
    """The tenant name of ``key``: 16 hex digits of its SHA-256 (the key itself is never stored)."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _checked(keys: Iterable[str], where: str) -> list[str]:
    out = [k.strip() for k in keys if k.strip() and not k.strip().startswith("#")]
    bad = [k for k in out if not k.startswith(PREFIX) or len(k) < len(PREFIX) + 8]
    if bad:
        raise KeyFileError(f"{where}: {len(bad)} key(s) without the SDK's form ('{PREFIX}' and at least 8 more "
                           "characters); the tinker SDK refuses any other")
    if not out:
        raise KeyFileError(f"{where}: no API key in it")
    return out


def load_keys(path: Path | None, environ: dict[str, str] | None = None) -> list[str] | None:
    """The accepted keys: from ``path``, else from ``AGENTRL_TINKER_API_KEYS``; None when neither is set
    (an open server)."""
    env = os.environ if environ is None else environ
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise KeyFileError(f"--api-keys {path}: cannot read it ({e.strerror})") from e
        return _checked(text.splitlines(), f"--api-keys {path}")
    if env.get(KEYS_ENV):
        return _checked(env[KEYS_ENV].split(","), KEYS_ENV)
    return None


def check_open(keys: list[str] | None, host: str) -> None:
    """Refuse an open server (no keys) on an address other than loopback."""
    if keys is None and host not in LOOPBACK:
        raise KeyFileError(f"--host {host}: a server reachable from other machines needs API keys (--api-keys FILE "
                           f"or {KEYS_ENV}); without keys it binds to 127.0.0.1 only")


class Keys:
    """Who a request's ``X-API-Key`` header belongs to."""

    def __init__(self, keys: list[str] | None) -> None:
        self.open = keys is None
        self._owners = {k.encode(): owner_of(k) for k in keys or []}

    def owner(self, header: str | None) -> str:
        """The owner of the key in ``header``; :class:`TinkerAuthError` for none or an unknown one."""
        if not header:
            raise TinkerAuthError("no API key: send it in the X-API-Key header (the SDK's api_key or TINKER_API_KEY)")
        if self.open:
            if not header.startswith(PREFIX):
                raise TinkerAuthError(f"API keys start with '{PREFIX}'")
            return owner_of(header)
        given = header.encode()
        for key, owner in self._owners.items():
            if hmac.compare_digest(key, given):
                return owner
        raise TinkerAuthError("unknown API key")
