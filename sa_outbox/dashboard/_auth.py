"""Who may see the dashboard: `allow_anyone` for a gate of your own, `TokenGate` for the server.

Mounting the dashboard requires an ``authorize`` callable, so nothing is open by default.
``sa-outbox dashboard`` (`create_app`) is guarded by a `TokenGate`: a request must carry the
token as ``Authorization: Bearer <token>``, or the cookie a browser gets by opening the
dashboard once with ``?token=<token>``.
"""

from __future__ import annotations

import hmac

from flask import request

from .._exceptions import InvalidArgument, InvalidArgumentType

__all__ = ["MIN_TOKEN_LENGTH", "TOKEN_COOKIE", "TokenGate", "allow_anyone"]

#: The cookie holding a browser's token, set when it opens the dashboard with ``?token=``.
TOKEN_COOKIE = "sa_outbox_dashboard_token"
#: The shortest token a `TokenGate` takes.
MIN_TOKEN_LENGTH = 16


def allow_anyone() -> bool:
    """An ``authorize`` that lets every request in: for a dashboard behind a gate of yours.

    Use it only where something in front of the app already authenticates (a VPN, a
    reverse proxy with its own login), or on a laptop.

    Examples:
        >>> allow_anyone()
        True
    """
    return True


class TokenGate:
    """An ``authorize`` callable: the request carries ``token`` as a bearer token or cookie.

    The comparison takes the same time whatever the guess (`hmac.compare_digest`).

    Examples:
        >>> gate = TokenGate("s3cret-s3cret-s3cret")
        >>> gate.accepts("s3cret-s3cret-s3cret"), gate.accepts("guess")
        (True, False)
        >>> try:
        ...     TokenGate("short")
        ... except InvalidArgument as exc:
        ...     print(exc)
        the dashboard token must be at least 16 characters, got 5
    """

    def __init__(self, token: str) -> None:
        if not isinstance(token, str):
            raise InvalidArgumentType(f"the dashboard token must be a str, got {token!r}")
        if len(token) < MIN_TOKEN_LENGTH or token != token.strip():
            raise InvalidArgument(
                f"the dashboard token must be at least {MIN_TOKEN_LENGTH} characters, "
                f"got {len(token.strip())}"
            )
        self._token = token.encode()

    def accepts(self, candidate: str | None) -> bool:
        """Whether ``candidate`` is the token."""
        return candidate is not None and hmac.compare_digest(candidate.encode(), self._token)

    def __call__(self) -> bool:
        """Whether the current Flask request carries the token (header or cookie)."""
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and self.accepts(value.strip()):
            return True
        return self.accepts(request.cookies.get(TOKEN_COOKIE))

    def __repr__(self) -> str:
        return "TokenGate(<hidden>)"
