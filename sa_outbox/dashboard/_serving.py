"""`make_server`: werkzeug's development server for the dashboard, whose request log never
shows the token (``sa-outbox dashboard`` serves with it)."""

from __future__ import annotations

import re
from typing import Any

from flask import Flask
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler
from werkzeug.serving import make_server as _werkzeug_server

__all__ = ["HIDDEN", "hide_token", "make_server"]

#: What a log line shows in place of a token.
HIDDEN = "<hidden>"
# A ``token=`` query parameter, whatever its value (a wrong guess may be close to the real one).
_TOKEN_PARAMETER = re.compile(r"([?&;]token=)[^&;#\s\"]*", re.IGNORECASE)


def hide_token(line: str, token: str | None = None) -> str:
    """``line`` with the value of every ``token=`` query parameter, and ``token`` itself
    wherever it appears, replaced by `HIDDEN`.

    Examples:
        >>> hide_token('"GET /jobs?status=failed&token=s3cret-s3cret-s3cret HTTP/1.1" 302 -')
        '"GET /jobs?status=failed&token=<hidden> HTTP/1.1" 302 -'
        >>> hide_token("code 400, message Bad request ('GET /s3cret-s3cret-s3cret')",
        ...            "s3cret-s3cret-s3cret")
        "code 400, message Bad request ('GET /<hidden>')"
    """
    hidden = _TOKEN_PARAMETER.sub(lambda found: found[1] + HIDDEN, line)
    return hidden.replace(token, HIDDEN) if token else hidden


class _TokenHidingHandler(WSGIRequestHandler):
    """werkzeug's request handler: every line it logs (requests, errors) goes through
    `hide_token` first."""

    token: str | None = None

    def log(self, type: str, message: str, *args: Any) -> None:
        line = message % args if args else message
        super().log(type, "%s", hide_token(line, self.token))


def make_server(host: str, port: int, app: Flask, *, token: str | None) -> BaseWSGIServer:
    """werkzeug's threaded server for ``app`` (`create_app`'s), logging each request as
    werkzeug does (to the ``werkzeug`` logger) but with the token hidden, so an address
    that carries ``?token=`` does not put it in the log.

    Examples:
        >>> from flask import Flask
        >>> server = make_server("127.0.0.1", 0, Flask("t"), token="s3cret-s3cret-s3cret")
        >>> server.server_port > 0
        True
        >>> server.server_close()
    """
    handler = type("TokenHidingHandler", (_TokenHidingHandler,), {"token": token})
    return _werkzeug_server(host, port, app, threaded=True, request_handler=handler)
