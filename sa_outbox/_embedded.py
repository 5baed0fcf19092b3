"""An embedded PostgreSQL for demos and tests on a machine with no server (``pgserver``)."""

from __future__ import annotations

import importlib
import tempfile
import warnings
from pathlib import Path

from ._exceptions import SaOutboxError


def embedded_database_url(data_dir: str | Path | None = None) -> str:
    """Start (or reuse) an embedded PostgreSQL and return its SQLAlchemy URL.

    The server is the ``pgserver`` package's PostgreSQL, listening on a Unix socket in
    ``data_dir`` (a fresh temporary folder by default); it stops when the process exits.
    Install it with ``pip install "sa-outbox[embedded]"``.

    Example:
        url = embedded_database_url()
        url.startswith("postgresql+psycopg://")
        # -> True
    """
    folder = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="sa-outbox-pg-"))
    with warnings.catch_warnings():
        # platformdirs (imported by pgserver) warns when XDG_RUNTIME_DIR is unset, as in CI
        # and containers; harmless here.
        warnings.simplefilter("ignore")
        try:
            pgserver = importlib.import_module("pgserver")
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise SaOutboxError(
                "no database URL was given and the embedded PostgreSQL is not installed: "
                'pass a URL, or install it with pip install "sa-outbox[embedded]"'
            ) from exc
        pgserver.get_server(str(folder), cleanup_mode="stop")
    return f"postgresql+psycopg://postgres@/postgres?host={folder}"
