"""The proxy's two credentials: an admin key for the control plane, a capability token per session.

The control plane (``POST /sessions``, ``/s/{id}/trajectory``, ``/finalize``, ``/discard``, ``/health``) is the
host's: it needs the **admin key**, which no sandbox is ever given. The data plane (the model routes of one
session, ``/s/{id}/v1/…``) needs that session's **capability token**: ``HMAC-SHA256(admin key, session id)``,
minted by the host when it opens the session and handed to the harness as its API key. A token opens the
model routes of its own session only; it is worthless on another session's routes and on every control route.

Why HMAC rather than a random token stored per session: verification needs no shared state, so every proxy
replica (the local server, any number of Ray Serve replicas over the session shards) checks a token with the
admin key alone, and the session registries stay unchanged. A token is as unguessable as a random one (256-bit
key); a finalized or discarded session no longer exists, so its token opens nothing afterwards, and the
registries never reuse a session id they generated.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

from components.config import require

_TOKEN_PREFIX = "rein-s-"  # recognisable in a leaked log line; carries no information
_MIN_ADMIN_KEY_CHARS = 16


def generate_admin_key() -> str:
    """A fresh random admin key (256 bits)."""
    return secrets.token_urlsafe(32)


@dataclass(frozen=True, kw_only=True)
class SessionKeys:
    """Mints and checks the proxy's credentials; holds the admin key, so it lives on the host only."""

    admin_key: str = field(repr=False)

    def __post_init__(self) -> None:
        require(
            isinstance(self.admin_key, str) and len(self.admin_key) >= _MIN_ADMIN_KEY_CHARS,
            "admin_key",
            f"must be a string of at least {_MIN_ADMIN_KEY_CHARS} characters",
        )

    @classmethod
    def generate(cls) -> SessionKeys:
        return cls(admin_key=generate_admin_key())

    def session_token(self, session_id: str) -> str:
        """The capability token of ``session_id``: the only credential its agent gets."""
        digest = hmac.new(
            self.admin_key.encode(), b"rein-session-token\x00" + session_id.encode(), hashlib.sha256
        )
        return _TOKEN_PREFIX + digest.hexdigest()

    def is_session_token(self, session_id: str, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(
            presented.encode(), self.session_token(session_id).encode()
        )

    def is_admin_key(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self.admin_key.encode())
