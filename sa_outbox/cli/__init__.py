"""Layer 5, integrations: the ``sa-outbox`` command line (also ``python -m sa_outbox``).

May import anything in the package; nothing in the package imports it. One module per
command group: ``_worker``, ``_relay``, ``_maintenance`` (prune, health, partitions),
``_jobs`` (jobs enqueue, list, show, retry), ``_outbox`` (outbox list, show, retry),
``_status`` (status, queues), ``_targets`` (which tables: --model / --jobs-table …),
``_render`` (tables, ages, JSON), ``_main`` (the parser, ``demo`` and `main`), ``_common`` (what
they share).

Every command finds the database the same way: ``--database-url URL``, else
``$SA_OUTBOX_DATABASE_URL``, else ``$DATABASE_URL`` (`given_database_url`); without any,
``demo`` starts a temporary embedded PostgreSQL and the others refuse to start. Every
command that reads the tables names them the same way: ``--model TARGET`` or ``--jobs-table
[SCHEMA.]TABLE`` (the job table), ``--outbox-model`` or ``--outbox-table``, and where they
apply ``--pause-model`` or ``--pause-table`` and ``--inbox-model`` or ``--inbox-table``: a
model as ``module:attribute``, or a table's name reflected from the database.

Commands:

``sa-outbox demo [--database-url URL] [--jobs N]``
    Runs the job queue and the outbox end to end in the schema ``sa_outbox_demo`` (dropped
    and created again) and prints a summary; with no database URL, on a temporary embedded
    PostgreSQL (``pip install "sa-outbox[embedded]"``), stopped and deleted at exit.

``sa-outbox worker TARGET [--queues a,b] [--concurrency N] [--database-url URL] …``
    Runs a worker for the `JobApp` at ``TARGET`` (``module:attribute``, e.g.
    ``myapp.tasks:app``; the attribute may also be a function returning one) until SIGTERM
    or SIGINT, then shuts down gracefully. An app with ``async def`` handlers runs on
    `AsyncWorker`, any other on `Worker`.

``sa-outbox relay TARGET [--once] [--database-url URL] [--log-level LEVEL]``
    Runs an outbox `Relay` (or `AsyncRelay`) until SIGTERM or SIGINT: claim → publish →
    mark, in each aggregate's order. ``--once`` runs one cycle and prints what it did.
    ``TARGET`` (``module:attribute``) is a function of an engine returning the relay
    (``myapp.outbox:make_relay``; the command makes the engine on the database URL, an
    ``AsyncEngine`` if the parameter is annotated so), or a relay object (or a function of
    no arguments returning one) that carries its own engine: then no URL is read.

``sa-outbox jobs enqueue KIND --payload JSON --model TARGET [--queue Q] [--priority N] …``
    Adds one job to the job table and prints its id, or that its ``--dedup-key`` (or, with
    ``--unique…``, its unique key) was taken and it was skipped; ``--delay 30s`` or
    ``--run-at ISO`` schedule it, ``--json`` prints ``{"id": …, "inserted": …}``.

``sa-outbox status [--model TARGET | --jobs-table T] [--outbox-model TARGET | …] …``
    Prints the jobs by queue, kind and status, the oldest ready job's age, the jobs failed
    in the last hour, expired leases, the outbox backlog and parked events, the workers
    connected now; ``--json`` for scripts, ``--watch [SECONDS]`` to refresh in place.

``sa-outbox jobs list|show|retry …``, ``sa-outbox outbox list|show|retry …``, ``sa-outbox queues``
    List jobs (``--status failed --kind K --queue Q --limit N``), show one whole, retry
    failed jobs by id or ``--all-failed``; list, show and retry parked events; each queue's
    depth and throughput. Inside an application, `run_admin` runs them with its engine and
    models.

``sa-outbox prune --model TARGET --older-than 7d [--outbox-model TARGET] …``
    Deletes finished jobs (and, with the outbox table, published events; with the inbox
    table, old inbox entries) older than the windows, ``--batch`` rows per short
    transaction, one pruner at a time per table (`Pruner`); prints progress every
    ``--progress-every`` batches.

``sa-outbox health --model TARGET [--outbox-model TARGET]``
    Prints `table_health`: row counts, dead tuples, vacuum times, sizes, the oldest ready
    pending job and the sessions holding back the xmin horizon, in human units.

``sa-outbox partitions maintain --model TARGET [--ahead N] [--retention 7d]``
    Runs `maintain_partitions` on the partitioned job model (or ``--outbox-model``):
    creates partitions ``--ahead`` intervals ahead, drops those past ``--retention`` that
    hold no unfinished work, and prints what it created, moved, dropped and kept.

Each command is a function that adds its subparser and sets ``handler`` to a function of
the parsed arguments returning the exit status: 0 on success, 1 on a runtime error (printed
as ``sa-outbox COMMAND: error: …``), 2 on a usage error (argparse's own convention, reported
by the command's own parser, with its usage). ``worker`` and ``relay`` connect once before
they start: a database they cannot reach at all is a runtime error, in one line.

Examples:
    >>> args = build_parser().parse_args(["demo", "--jobs", "50"])
    >>> args.command, args.jobs, args.database_url
    ('demo', 50, None)
    >>> args = build_parser().parse_args(
    ...     ["worker", "myapp.tasks:app", "--queues", "default,emails", "--concurrency", "16"])
    >>> args.target, args.queues, args.concurrency
    ('myapp.tasks:app', ['default', 'emails'], 16)
"""

from ._common import (
    ENV_APP_DATABASE_URL,
    ENV_DATABASE_URL,
    CommandError,
    database_url,
    given_database_url,
    load_table,
    parse_duration,
    positive_seconds,
    seconds_or_zero,
)
from ._main import build_admin_parser, build_parser, main, run_admin
from ._relay import load_relay_target
from ._worker import load_target

__all__ = [
    "ENV_APP_DATABASE_URL",
    "ENV_DATABASE_URL",
    "CommandError",
    "build_admin_parser",
    "build_parser",
    "database_url",
    "given_database_url",
    "load_relay_target",
    "load_table",
    "load_target",
    "main",
    "parse_duration",
    "positive_seconds",
    "run_admin",
    "seconds_or_zero",
]
