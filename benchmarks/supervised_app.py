"""The `JobApp` a `Supervisor`'s children import in W5P: no-op jobs in ``$SA_OUTBOX_BENCH_SCHEMA``.

A child process imports its app from a ``module:attribute`` path, so the app of a run whose
tables live in a schema of its own is built here, from the environment the parent set.
"""

from __future__ import annotations

import os

from benchmarks.sa_models import models_for
from sa_outbox import JobApp

#: Set by the parent before it starts the supervisor.
ENV_SCHEMA = "SA_OUTBOX_BENCH_SCHEMA"

app = JobApp(models_for(os.environ.get(ENV_SCHEMA, "bench_sa_sync")).job)
app.register("noop", lambda job: None)
