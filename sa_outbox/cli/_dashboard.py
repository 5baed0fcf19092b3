"""``sa-outbox dashboard``: serve the web dashboard (sa_outbox.dashboard) alone."""

from __future__ import annotations

import argparse
import os
import secrets

from .._exceptions import InvalidArgument
from ._common import CommandError, _add_command, _add_database_url, _not_negative_int
from ._targets import (
    add_job_target,
    add_outbox_target,
    add_steps_target,
    database,
    dependencies_table,
    job_table,
    outbox_table,
    steps_table,
)

_EXAMPLE = """\
example:
  sa-outbox dashboard --port 8080 --model myapp.models:Job --outbox-model myapp.models:OutboxEvent
  SA_OUTBOX_DASHBOARD_TOKEN=... sa-outbox dashboard --read-only --jobs-table public.jobs
  sa-outbox dashboard --jobs-table public.jobs --steps-table public.job_steps \
      --dependencies-table public.job_dependencies    # steps and workflows too

Every request needs the token: open the printed address (it carries ?token= once, then a
cookie does), or send "Authorization: Bearer TOKEN". Without --token or
SA_OUTBOX_DASHBOARD_TOKEN a random token is made and printed. Serves on 127.0.0.1 by
default (docs/dashboard.md). Needs pip install "sa-outbox[dashboard]".
"""


def _add_dashboard(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = _add_command(
        commands,
        "dashboard",
        help="serve the web dashboard: counts, jobs, failed jobs and their errors, retries",
        description=(
            "Serve the web dashboard (queue overview, jobs list and detail, retry, cancel, "
            "parked outbox events) until interrupted."
        ),
        epilog=_EXAMPLE,
    )
    parser.add_argument("--host", default="127.0.0.1", help="(default: %(default)s)")
    parser.add_argument(
        "--port",
        metavar="N",
        type=_not_negative_int,
        default=8080,
        help="0: any free port, printed at start (default: %(default)s)",
    )
    parser.add_argument(
        "--read-only", action="store_true", help="show only: no retry or cancel buttons"
    )
    parser.add_argument(
        "--token",
        metavar="TOKEN",
        help="the token every request must carry, 16 characters or more "
        "(default: $SA_OUTBOX_DASHBOARD_TOKEN, else a random one, printed)",
    )
    add_job_target(parser)
    add_outbox_target(parser)
    add_steps_target(parser)
    parser.add_argument(
        "--dependencies-table",
        metavar="TABLE",
        help="the dependencies table (JobDependencyMixin), e.g. public.job_dependencies: "
        "pages for the workflows",
    )
    _add_database_url(parser)
    parser.set_defaults(handler=_dashboard)


def _dashboard(args: argparse.Namespace) -> int:
    try:
        # Imported here, not at the top: Flask is an optional extra and the other commands
        # must run without it.
        from ..dashboard import create_app, make_server
    except ImportError as exc:
        raise CommandError(
            f'the dashboard needs Flask ({exc}): pip install "sa-outbox[dashboard]"'
        ) from None
    given = args.token or os.environ.get("SA_OUTBOX_DASHBOARD_TOKEN")
    token = given or secrets.token_urlsafe(24)
    with database(args) as engine:
        with engine.connect() as conn:
            jobs = job_table(args, conn)
            outbox = outbox_table(args, conn, required=False)
            steps = steps_table(args, conn)
            deps = None if args.dependencies_table is None else dependencies_table(args, conn)
        try:
            app = create_app(
                engine,
                jobs=jobs,
                outbox=outbox,
                steps=steps,
                dependencies=deps,
                read_only=args.read_only,
                token=token,
            )
        except InvalidArgument as exc:
            raise CommandError(f"--token: {exc}") from None
        server = make_server(args.host, args.port, app, token=token)  # the log hides it
        try:
            # Printed once the port is bound: a script may wait for this line.
            url = f"http://{args.host}:{server.server_port}/"
            print(f"sa-outbox dashboard on {url} (Ctrl-C stops it)", flush=True)
            if given is None:  # a token the user gave is not echoed into their logs
                print(f"open {url}?token={token}", flush=True)
            server.serve_forever()
        finally:
            server.server_close()
    return 0
