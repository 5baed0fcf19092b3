"""``sa-outbox worker``: load a `JobApp` and run `Worker` or `AsyncWorker` on it."""

from __future__ import annotations

import argparse
import asyncio

from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError

from .._asyncio_ext import create_async_engine
from .._connect_args import connect_args
from .._exceptions import InvalidArgument
from .._loading import load_instance
from .._pooler import prepare_for_pooler
from ..metrics import MetricsUnavailable, PrometheusMetrics, QueueStatusCollector, serve_metrics
from ..statements import WORKER_APPLICATION_PREFIX
from ..worker import AsyncWorker, JobApp, Supervisor, Worker
from ..worker._settings import default_worker_id
from ._common import (
    CommandError,
    _add_database_url,
    _add_listen_url,
    _add_log_level,
    _engine,
    _names,
    _not_negative_int,
    _positive_int,
    _setup_logging,
    _url_of,
    connect_once,
    database_url,
    given_listen_url,
    positive_seconds,
    seconds_or_zero,
)
from ._targets import load_pause_model


def _add_worker(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "worker",
        help="run the handlers of a JobApp until SIGTERM / SIGINT",
        description=(
            "Claim jobs in batches, run their handlers outside any transaction, acknowledge "
            "them in batches (fenced by their lease tokens), heartbeat, reclaim expired "
            "leases, wake up on NOTIFY. SIGTERM or SIGINT stops claiming, lets running jobs "
            "finish within --grace seconds, then releases the rest; a second signal skips "
            "the grace period."
        ),
    )
    parser.add_argument("target", metavar="TARGET", help="the JobApp, as module:attribute")
    _add_database_url(parser)
    _add_listen_url(parser)
    parser.add_argument(
        "--queues", metavar="A,B", type=_names, help="queues to serve (default: all)"
    )
    parser.add_argument(
        "--kinds",
        metavar="A,B",
        type=_names,
        help="job kinds to claim (default: those the app has handlers for; '*': every "
        "kind, failing those without a handler)",
    )
    parser.add_argument(
        "--processes",
        metavar="N",
        type=_positive_int,
        default=1,
        help="worker processes under one supervisor, each with --concurrency handlers; a "
        "child that dies is restarted (default: %(default)s)",
    )
    parser.add_argument(
        "--concurrency",
        metavar="N",
        type=_positive_int,
        default=10,
        help="handlers running at once (default: %(default)s)",
    )
    parser.add_argument(
        "--batch",
        metavar="N",
        type=_positive_int,
        help="most jobs per claim (default: 50, or --concurrency if larger)",
    )
    parser.add_argument(
        "--prefetch",
        metavar="N",
        type=_not_negative_int,
        help=(
            "most claimed jobs waiting for a free handler; 0 claims only for free handlers "
            "(default: adaptive, as many as the handlers finish in about 0.1 s)"
        ),
    )
    parser.add_argument(
        "--lease",
        metavar="SECONDS",
        type=positive_seconds,
        default=30.0,
        help="lease of a claimed job, renewed by heartbeats (default: %(default)g)",
    )
    parser.add_argument(
        "--grace",
        metavar="SECONDS",
        type=seconds_or_zero,
        default=10.0,
        help="time running jobs get to finish after SIGTERM; 0 releases them at once "
        "(default: %(default)g)",
    )
    parser.add_argument(
        "--poll-interval",
        metavar="SECONDS",
        type=positive_seconds,
        default=1.0,
        help="claim at least this often, notifications or not (default: %(default)g)",
    )
    parser.add_argument(
        "--no-listen", dest="listen", action="store_false", help="poll only, no LISTEN"
    )
    parser.add_argument(
        "--no-reclaim",
        dest="reclaim",
        action="store_false",
        help="leave expired leases to a separate reclaimer",
    )
    parser.add_argument("--worker-id", metavar="ID", help="default: host:pid:random")
    parser.add_argument(
        "--pause-model",
        metavar="TARGET",
        help="the paused-queues model (QueuePauseMixin), as module:attribute: claim no job "
        "of a queue paused there (sa-outbox queues pause QUEUE)",
    )
    parser.add_argument(
        "--metrics-port",
        metavar="PORT",
        type=_positive_int,
        help="serve Prometheus metrics at :PORT/metrics (needs sa-outbox[prometheus])",
    )
    _add_log_level(parser)
    parser.set_defaults(handler=_worker)


def load_target(target: str) -> JobApp:
    """The `JobApp` at ``module:attribute`` (the current directory is importable).

    The attribute may be a dotted path, or a function of no arguments returning the app.

    Examples:
        >>> load_target("json:dumps")
        Traceback (most recent call last):
        ...
        sa_outbox.cli.CommandError: json:dumps is not a JobApp (nor a function returning one)
    """
    try:
        app: JobApp = load_instance(target, JobApp, "a JobApp", example="myapp.tasks:app")
    except InvalidArgument as exc:
        raise CommandError(str(exc)) from None
    return app


def _worker(args: argparse.Namespace) -> int:
    _setup_logging(args.log_level, args.log_format)
    app = load_target(args.target)
    url = _url_of(args)
    listen_url = given_listen_url(args.listen_url)
    options = dict(
        queues=args.queues,
        kinds=args.kinds,
        concurrency=args.concurrency,
        batch=args.batch,
        prefetch=args.prefetch,
        lease=args.lease,
        grace=args.grace,
        poll_interval=args.poll_interval,
        listen=args.listen,
        listen_url=listen_url,
        reclaim=args.reclaim,
        worker_id=args.worker_id,
    )
    if args.pause_model:
        options["pauses"] = load_pause_model(args.pause_model)
    if args.processes > 1 and args.metrics_port is not None:
        raise CommandError("--metrics-port needs --processes 1 (one port, one process)")
    _first_connection(url, listen_url)
    if args.processes > 1:
        del options["worker_id"]
        supervisor = Supervisor(
            args.target,
            url.render_as_string(hide_password=False),
            processes=args.processes,
            worker_options=options,
            worker_id=args.worker_id,
            log_level=args.log_level,
        )
        return supervisor.run()
    # The worker names its connections, so that ``sa-outbox status`` lists it as connected.
    worker_id = options["worker_id"] = args.worker_id or default_worker_id()
    name = f"{WORKER_APPLICATION_PREFIX}{worker_id}"
    stop_metrics = None
    metrics_engine = None
    if args.metrics_port is not None:
        try:
            options["metrics"] = PrometheusMetrics()
            metrics_engine = _engine(url, name)
            QueueStatusCollector(
                metrics_engine, jobs=app.model, dependencies=app.dependencies_table
            ).register()
            stop_metrics = serve_metrics(args.metrics_port)
        except (MetricsUnavailable, OSError) as exc:
            raise CommandError(f"--metrics-port {args.metrics_port}: {exc}") from None
    try:
        if any(app[kind].is_async for kind in app.kinds):
            asyncio.run(_run_async(app, url, options, name))
        else:
            engine = _engine(url, name)
            try:
                Worker(app, engine, **options).run()
            finally:
                engine.dispose()
    except DBAPIError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        shown = url.render_as_string(hide_password=True)
        raise CommandError(f"database error on {shown}: {reason}") from exc
    finally:
        if stop_metrics is not None:
            stop_metrics()
        if metrics_engine is not None:
            metrics_engine.dispose()
    return 0


def _first_connection(url: URL, listen_url: str | None) -> None:
    """Connect once to the database (and the LISTEN URL) before starting: a URL that cannot
    work fails the command in one line; an outage after the start is ridden out."""
    for each in (url, None if listen_url is None else database_url(listen_url)):
        if each is None:
            continue
        engine = _engine(each)
        try:
            connect_once(engine)
        finally:
            engine.dispose()


async def _run_async(app: JobApp, url: URL, options: dict[str, object], name: str) -> None:
    args = connect_args()
    if "application_name" not in url.query:  # the URL's own name wins
        args["application_name"] = name
    engine = create_async_engine(url, connect_args=args)
    prepare_for_pooler(engine)
    try:
        await AsyncWorker(app, engine, **options).run()  # type: ignore[arg-type]
    finally:
        await engine.dispose()
