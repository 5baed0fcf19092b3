"""``sa-outbox relay``: load a `Relay` or `AsyncRelay` and run it."""

from __future__ import annotations

import argparse
import asyncio

from sqlalchemy.exc import DBAPIError

from ..relay import AsyncRelay, Relay, RelayReport
from ..relay._loader import load_relay
from ._common import CommandError, _add_log_level, _setup_logging


def _add_relay(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "relay",
        help="publish committed outbox events until SIGTERM / SIGINT",
        description=(
            "Claim committed outbox events in batches (aggregate by aggregate), publish them "
            "through the relay's publisher in each aggregate's order, mark what the broker "
            "took, back off and park what it keeps rejecting; wake up on NOTIFY. SIGTERM or "
            "SIGINT finishes the current batch, then stops."
        ),
    )
    parser.add_argument(
        "target", metavar="TARGET", help="the Relay or AsyncRelay, as module:attribute"
    )
    parser.add_argument("--once", action="store_true", help="run one cycle, print it, exit")
    _add_log_level(parser)
    parser.set_defaults(handler=_relay)


def _format_relay_report(report: RelayReport) -> str:
    text = (
        f"relay {report.relay}: {report.claimed} claimed, {report.published} published, "
        f"{report.rejected} rejected ({report.parked} parked), {report.released} released"
    )
    return text + (f"; broker unavailable: {report.unavailable}" if report.unavailable else "")


def _relay(args: argparse.Namespace) -> int:
    _setup_logging(args.log_level)
    relay = load_relay(args.target)
    try:
        if isinstance(relay, AsyncRelay):
            asyncio.run(_run_async_relay(relay, once=args.once))
        else:
            _run_relay(relay, once=args.once)
    except DBAPIError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise CommandError(f"database error: {reason}") from exc
    return 0


def _run_relay(relay: Relay, *, once: bool) -> None:
    import signal

    previous = {
        signum: signal.signal(signum, lambda *_: relay.stop())
        for signum in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        if once:
            print(_format_relay_report(relay.run_once()))
        else:
            relay.run()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        relay.close()
        relay.engine.dispose()  # the command owns the process: close its connections


async def _run_async_relay(relay: AsyncRelay, *, once: bool) -> None:
    import signal

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, relay.stop)
    try:
        if once:
            print(_format_relay_report(await relay.run_once()))
        else:
            await relay.run()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await relay.aclose()
        await relay.engine.dispose()
