"""``sa-outbox relay``: load a `Relay` or `AsyncRelay`, or make one on a database URL; run it.

TARGET names one of:

- a `Relay` or `AsyncRelay` (``myapp.outbox:relay``): it carries its own engine, so
  ``--database-url`` is refused and the environment's URL is not read;
- a function of no arguments returning one (``myapp.outbox:create_relay``): the same;
- a function of the engine (``myapp.outbox:make_relay``): its one required parameter is
  annotated ``Engine`` or ``AsyncEngine``, or named ``engine``. The command makes that
  engine on ``--database-url``, else ``$SA_OUTBOX_DATABASE_URL``, else ``$DATABASE_URL``,
  and passes it: an ``AsyncEngine`` (for an `AsyncRelay`) when the parameter is annotated
  so, an ``Engine`` (for a `Relay`) otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import inspect
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import Engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError

from .._asyncio_ext import create_async_engine, is_async_engine, is_async_engine_class
from .._connect_args import check_listen_url, connect_args
from .._exceptions import InvalidArgument
from .._loading import import_target
from .._pooler import prepare_for_pooler
from ..metrics import (
    MetricsUnavailable,
    PrometheusRelayMetrics,
    QueueStatusCollector,
    serve_metrics,
)
from ..relay import AsyncRelay, Relay, RelayReport
from ._common import (
    CommandError,
    _add_database_url,
    _add_listen_url,
    _add_log_level,
    _database_error,
    _engine,
    _positive_int,
    _resolve_url,
    _setup_logging,
    connect_once,
    connect_once_async,
    given_listen_url,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

_EXAMPLE = "myapp.outbox:make_relay"
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _add_relay(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "relay",
        help="publish committed outbox events until SIGTERM / SIGINT",
        description=(
            "Claim committed outbox events in batches (aggregate by aggregate), publish them "
            "through the relay's publisher in each aggregate's order, mark what the broker "
            "took, back off and park what it keeps rejecting; wake up on NOTIFY. SIGTERM or "
            "SIGINT finishes the current batch, then stops. TARGET is a function of the "
            "engine returning the relay (def make_relay(engine: Engine) -> Relay; annotate "
            "the parameter AsyncEngine for an AsyncRelay): the command makes the engine on "
            "the database URL. TARGET may also be a Relay or an AsyncRelay (or a function of "
            "no arguments returning one) that carries its own engine: then no URL is read."
        ),
    )
    parser.add_argument(
        "target",
        metavar="TARGET",
        help="a function of an engine returning the Relay or AsyncRelay, or the relay "
        "itself, as module:attribute",
    )
    parser.add_argument("--once", action="store_true", help="run one cycle, print it, exit")
    parser.add_argument(
        "--metrics-port",
        metavar="PORT",
        type=_positive_int,
        help="serve Prometheus metrics at :PORT/metrics: the relay's counters and "
        "histograms, the outbox backlog and parked gauges (needs sa-outbox[prometheus])",
    )
    _add_database_url(parser, "PostgreSQL URL of the engine given to a TARGET function")
    _add_listen_url(parser)
    _add_log_level(parser)
    parser.set_defaults(handler=_relay)


def _format_relay_report(report: RelayReport) -> str:
    text = (
        f"relay {report.relay}: {report.claimed} claimed, {report.published} published, "
        f"{report.rejected} rejected ({report.parked} parked), {report.released} released"
    )
    return text + (f"; broker unavailable: {report.unavailable}" if report.unavailable else "")


def _parameters(function: Callable[..., Any]) -> list[inspect.Parameter]:
    try:
        signature = inspect.signature(function, eval_str=True)
    except NameError:  # an annotation only a type checker can resolve: read its text
        signature = inspect.signature(function)
    return list(signature.parameters.values())


_KIND_BY_NAME: dict[str, Literal["sync", "async"]] = {"Engine": "sync", "AsyncEngine": "async"}


def _engine_kind(parameter: inspect.Parameter) -> Literal["sync", "async"] | None:
    """What engine a function's one required parameter asks for (``None``: not an engine)."""
    annotation = parameter.annotation
    if annotation is inspect.Parameter.empty:
        return "sync" if parameter.name == "engine" else None
    if isinstance(annotation, str):  # not resolvable at run time: read its last name
        return _KIND_BY_NAME.get(annotation.rpartition(".")[2])
    if isinstance(annotation, type) and is_async_engine_class(annotation):
        return "async"
    if isinstance(annotation, type) and issubclass(annotation, Engine):
        return "sync"
    return None


def _required(parameters: list[inspect.Parameter]) -> list[inspect.Parameter]:
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [
        p for p in parameters if p.default is inspect.Parameter.empty and p.kind not in variadic
    ]


def _not_a_relay(target: str) -> CommandError:
    return CommandError(
        f"{target} is not a Relay or an AsyncRelay, nor a function of an engine (or of no "
        "arguments) returning one"
    )


def _own_engine(target: str, what: str) -> CommandError:
    return CommandError(
        f"--database-url cannot apply to {target}: it is {what} with an engine of its own; "
        f"name a function of the engine instead (e.g. {_EXAMPLE}, "
        "def make_relay(engine: Engine) -> Relay)"
    )


def load_relay_target(
    target: str, database_url: str | None
) -> tuple[Relay | AsyncRelay, Engine | AsyncEngine | None]:
    """The relay TARGET names, and the engine the command made for it (``None`` if none).

    ``database_url`` is the ``--database-url`` argument (``None``: the environment's, read
    only when TARGET is a function of an engine).

    Examples:
        >>> load_relay_target("json:dumps", None)
        Traceback (most recent call last):
        ...
        sa_outbox.cli.CommandError: json:dumps is not a Relay or an AsyncRelay, nor a function of an engine (or of no arguments) returning one
    """  # noqa: E501 - a doctest's expected output is one line
    try:
        found = import_target(target, example="myapp.outbox:relay")
    except InvalidArgument as exc:
        raise CommandError(str(exc)) from None
    if isinstance(found, Relay | AsyncRelay):
        if database_url:
            raise _own_engine(target, f"a {type(found).__name__}")
        return found, None
    if not inspect.isfunction(found):
        raise _not_a_relay(target)
    parameters = _parameters(found)
    required = _required(parameters)
    engine: Engine | AsyncEngine | None = None
    first_only = bool(required) and required == parameters[:1]
    kind = _engine_kind(required[0]) if first_only and required[0].kind in _POSITIONAL else None
    if not required:
        if database_url:
            raise _own_engine(target, "a function of no arguments")
        made = found()
    elif kind is not None:
        url = _resolve_url(database_url)
        if kind == "async":
            engine = create_async_engine(url, connect_args=connect_args())
            prepare_for_pooler(engine)
        else:
            engine = _engine(url)
        made = found(engine)
    else:
        raise _not_a_relay(target)
    if not isinstance(made, Relay | AsyncRelay):
        if engine is not None:
            _dispose_now(engine)
        raise _not_a_relay(target)
    return made, engine


def _dispose_now(engine: Engine | AsyncEngine) -> None:
    if is_async_engine(engine):
        asyncio.run(engine.dispose())
    else:
        engine.dispose()


def _relay(args: argparse.Namespace) -> int:
    _setup_logging(args.log_level, args.log_format)
    relay, made = load_relay_target(args.target, args.database_url)
    listen_url = given_listen_url(args.listen_url)
    if listen_url is not None:
        relay.settings = dataclasses.replace(
            relay.settings, listen_url=check_listen_url(listen_url)
        )
    stop_metrics: Callable[[], None] | None = None
    if args.metrics_port is not None:
        try:
            stop_metrics = _serve_relay_metrics(relay, args.metrics_port)
        except BaseException:
            _close_now(relay, made)
            raise
    try:
        if isinstance(relay, AsyncRelay):
            asyncio.run(_run_async_relay(relay, made, once=args.once))
        else:
            _run_relay(relay, made, once=args.once)
    except DBAPIError as exc:
        url: URL = relay.engine.url
        raise _database_error(url, exc) from exc
    finally:
        if stop_metrics is not None:
            stop_metrics()
    return 0


def _serve_relay_metrics(relay: Relay | AsyncRelay, port: int) -> Callable[[], None]:
    """Count the relay's cycles into Prometheus, add the outbox gauges (read on a sync
    engine of the relay's database at each scrape) and serve them; returns the stop."""
    try:
        relay.metrics = PrometheusRelayMetrics()
        url = relay.engine.url
        if isinstance(relay, AsyncRelay):  # the gauges read synchronously, with psycopg
            url = url.set(drivername="postgresql+psycopg")
        engine = _engine(url, f"sa-outbox relay metrics {relay.name}")
        QueueStatusCollector(engine, outbox=relay.table).register()
    except MetricsUnavailable as exc:
        raise CommandError(f"--metrics-port {port}: {exc}") from None
    try:
        stop_serving = serve_metrics(port)
    except OSError as exc:
        engine.dispose()
        raise CommandError(f"--metrics-port {port}: {exc}") from None

    def stop() -> None:
        stop_serving()
        engine.dispose()

    return stop


def _close_now(relay: Relay | AsyncRelay, made: Engine | AsyncEngine | None) -> None:
    if isinstance(relay, AsyncRelay):

        async def close() -> None:
            await relay.aclose()
            await relay.engine.dispose()

        asyncio.run(close())
    else:
        relay.close()
        relay.engine.dispose()
    if made is not None and made is not relay.engine:
        _dispose_now(made)


def _run_relay(relay: Relay, made: Engine | AsyncEngine | None, *, once: bool) -> None:
    previous: dict[int, Any] = {}
    try:
        # A URL that cannot work fails now, in one line; a server not ready yet is waited
        # for, and a SIGTERM meanwhile ends the command as it would before the relay starts.
        connect_once(relay.engine)
        previous = {
            signum: signal.signal(signum, lambda *_: relay.stop())
            for signum in (signal.SIGTERM, signal.SIGINT)
        }
        if once:
            print(_format_relay_report(relay.run_once()))
        else:
            relay.run()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        relay.close()
        relay.engine.dispose()  # the command owns the process: close its connections
        if made is not None and made is not relay.engine:
            _dispose_now(made)


async def _run_async_relay(
    relay: AsyncRelay, made: Engine | AsyncEngine | None, *, once: bool
) -> None:
    loop = asyncio.get_running_loop()
    try:
        await connect_once_async(relay.engine)  # as in _run_relay: before the handlers
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, relay.stop)
        if once:
            print(_format_relay_report(await relay.run_once()))
        else:
            await relay.run()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await relay.aclose()
        await relay.engine.dispose()
        if is_async_engine(made) and made is not relay.engine:
            await made.dispose()
        elif isinstance(made, Engine):
            made.dispose()
