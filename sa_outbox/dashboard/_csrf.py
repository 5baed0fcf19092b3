"""CSRF protection that needs nothing from the host app: a double-submit cookie.

The token lives in a cookie of the dashboard's own (not Flask's session, which would need
the host app's ``SECRET_KEY``); every form carries it back and a POST whose form token does
not match the cookie is refused. Another site can make a browser send the cookie, but it
cannot read it to put it in the form.
"""

from __future__ import annotations

import hmac
import secrets

from flask import Request, g

#: The cookie holding the dashboard's CSRF token.
CSRF_COOKIE = "sa_outbox_csrf"
#: The form field every POST must carry, equal to the cookie.
CSRF_FIELD = "csrf_token"


def token_of(request: Request) -> tuple[str, bool]:
    """The request's CSRF token and whether it is new (to be set as the cookie); a new one
    is made once per request, so the page's forms and the cookie agree.

    Examples:
        >>> from flask import Flask
        >>> with Flask("t").test_request_context(headers={"Cookie": "sa_outbox_csrf=abc"}):
        ...     from flask import request
        ...     token_of(request)
        ('abc', False)
    """
    found = request.cookies.get(CSRF_COOKIE, "")
    if found:
        return found, False
    if "sa_outbox_csrf" not in g:
        g.sa_outbox_csrf = secrets.token_urlsafe(32)
    return str(g.sa_outbox_csrf), True


def csrf_ok(request: Request) -> bool:
    """Whether a POST carries in its form the token of its cookie.

    Any text is compared, not only ASCII: a forged token in another script is a refusal,
    never an error (the two are compared as UTF-8 bytes, in constant time).

    Examples:
        >>> from flask import Flask
        >>> with Flask("t").test_request_context(method="POST", data={"csrf_token": "x"}):
        ...     from flask import request
        ...     csrf_ok(request)
        False
        >>> with Flask("t").test_request_context(
        ...     method="POST", data={"csrf_token": "é"}, headers={"Cookie": "sa_outbox_csrf=abc"}
        ... ):
        ...     csrf_ok(request)
        False
    """
    cookie = request.cookies.get(CSRF_COOKIE, "")
    given = request.form.get(CSRF_FIELD, "")
    return bool(cookie) and hmac.compare_digest(_utf8(cookie), _utf8(given))


def _utf8(text: str) -> bytes:
    # hmac.compare_digest refuses str with non-ASCII characters (TypeError); bytes it takes.
    # surrogatepass keeps distinct strings distinct, whatever a client sent.
    return text.encode("utf-8", "surrogatepass")
