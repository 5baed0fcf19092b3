"""The benchmark database: ``sa_outbox_bench`` on the server given, one schema per system."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

__all__ = ["BENCH_DATABASE", "DEFAULT_URL", "ENV_NAME", "ENV_URL", "Database"]

#: The database the suite creates (if missing) and uses, never the tests' database.
BENCH_DATABASE = "sa_outbox_bench"
#: Names another database for the suite (two suites on one server at once).
ENV_NAME = "SA_OUTBOX_BENCH_DATABASE"
#: Where the server is, when neither --database-url nor the environment says.
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
ENV_URL = "SA_OUTBOX_BENCH_DATABASE_URL"


@dataclasses.dataclass(frozen=True)
class Database:
    """The server's address, and helpers to reach ``sa_outbox_bench`` on it."""

    host: str | None
    port: int | None
    user: str | None
    password: str | None
    admin_database: str
    #: The database the suite works in (`BENCH_DATABASE` unless told otherwise).
    name: str = BENCH_DATABASE

    @classmethod
    def from_url(cls, url: str | None, name: str | None = None) -> Database:
        """Parse ``url`` (``postgresql://`` or ``postgresql+psycopg://``); only its server counts.

        ``None`` reads ``$SA_OUTBOX_BENCH_DATABASE_URL``, else `DEFAULT_URL`. The suite's
        database is ``name``, else ``$SA_OUTBOX_BENCH_DATABASE``, else `BENCH_DATABASE`.
        """
        from sqlalchemy.engine import make_url

        parsed = make_url(url or os.environ.get(ENV_URL) or DEFAULT_URL)
        if not parsed.drivername.startswith("postgresql"):
            raise ValueError(f"the benchmarks need a PostgreSQL URL, got {parsed.drivername!r}")
        return cls(
            host=parsed.host,
            port=parsed.port,
            user=parsed.username,
            password=parsed.password,
            admin_database=parsed.database or "postgres",
            name=name or os.environ.get(ENV_NAME) or BENCH_DATABASE,
        )

    def _params(self, dbname: str) -> dict[str, Any]:
        params: dict[str, Any] = {"dbname": dbname}
        for key, value in (
            ("host", self.host),
            ("port", self.port),
            ("user", self.user),
            ("password", self.password),
        ):
            if value is not None:
                params[key] = value
        return params

    def conninfo(self, schema: str | None = None) -> str:
        """A libpq connection string to ``sa_outbox_bench`` (``search_path`` = ``schema``)."""
        from psycopg.conninfo import make_conninfo

        params = self._params(self.name)
        if schema is not None:
            params["options"] = f"-c search_path={schema}"
        return make_conninfo(**params)

    def sqlalchemy_url(self) -> Any:
        """The ``postgresql+psycopg`` URL of ``sa_outbox_bench``, as a SQLAlchemy `URL`."""
        from sqlalchemy.engine import URL

        return URL.create(
            "postgresql+psycopg",
            username=self.user,
            password=self.password,
            host=self.host,
            port=self.port,
            database=self.name,
        )

    def libpq_env(self, schema: str) -> dict[str, str]:
        """Environment variables for a libpq tool (pgbench) to reach ``schema``."""
        env = {"PGDATABASE": self.name, "PGOPTIONS": f"-c search_path={schema}"}
        for key, value in (
            ("PGHOST", self.host),
            ("PGPORT", self.port),
            ("PGUSER", self.user),
            ("PGPASSWORD", self.password),
        ):
            if value is not None:
                env[key] = str(value)
        return env

    def ensure_database(self) -> None:
        """CREATE DATABASE sa_outbox_bench (or `name`) if the server lacks it."""
        import psycopg
        from psycopg.conninfo import make_conninfo

        admin = make_conninfo(**self._params(self.admin_database))
        with psycopg.connect(admin, autocommit=True) as conn:
            found = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (self.name,)
            ).fetchone()
            if found is None:
                conn.execute(f'CREATE DATABASE "{self.name}"')

    def reset_schema(self, schema: str) -> None:
        """Drop ``schema`` with everything in it and create it empty (bench database only)."""
        import psycopg

        with psycopg.connect(self.conninfo(), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            conn.execute(f'CREATE SCHEMA "{schema}"')

    def drop_schema(self, schema: str) -> None:
        """Drop ``schema`` (after the suite: the database keeps no rows around)."""
        import psycopg

        with psycopg.connect(self.conninfo(), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    def execute(self, schema: str, sql: str) -> None:
        """Run ``sql`` (``VACUUM`` too: autocommit) with ``search_path`` = ``schema``."""
        import psycopg

        with psycopg.connect(self.conninfo(schema), autocommit=True) as conn:
            conn.execute(sql)

    def scalar(self, schema: str, sql: str) -> Any:
        """One value from ``sql``, run with ``search_path`` = ``schema``."""
        import psycopg

        with psycopg.connect(self.conninfo(schema), autocommit=True) as conn:
            row = conn.execute(sql).fetchone()
            return None if row is None else row[0]
