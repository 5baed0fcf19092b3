"""A throwaway PostgreSQL cluster with the server's default settings, for W7.

W7 is about what autovacuum does under load, so it must run where autovacuum has its
defaults (on, ``autovacuum_naptime = 1min``, scale factors 0.2 / 0.1). CI servers often turn
it off (this project's does, in ``conf.d/90-ci.conf``), and a benchmark must not change the
shared server's configuration. So when the given server's autovacuum is off, W7 runs on a
cluster of its own: ``initdb`` from the same installation, default ``postgresql.conf``, a
free port on 127.0.0.1, removed afterwards.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator

__all__ = ["default_cluster", "find_bindir"]

#: pg_ctl's arguments after the data directory and the server options: wait until it is up.
START = ("-w", "start")


def find_bindir() -> pathlib.Path | None:
    """The directory of ``initdb`` / ``pg_ctl``: from ``pg_config``, else Debian's layout."""
    pg_config = shutil.which("pg_config")
    candidates: list[str] = []
    if pg_config:
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            out = subprocess.run(
                [pg_config, "--bindir"], check=True, capture_output=True, text=True
            ).stdout.strip()
            candidates.append(out)
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for candidate in candidates:
        path = pathlib.Path(candidate)
        if (path / "initdb").exists() and (path / "pg_ctl").exists():
            return path
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_owner(argv: list[str]) -> list[str]:
    # initdb and postgres refuse to run as root: run them as the postgres system user.
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


@contextlib.contextmanager
def default_cluster() -> Iterator[str]:
    """Start a fresh cluster with default settings; yield its ``postgresql://`` URL."""
    bindir = find_bindir()
    if bindir is None:
        raise RuntimeError("initdb/pg_ctl not found (pg_config --bindir, /usr/lib/postgresql)")
    root = pathlib.Path(tempfile.mkdtemp(prefix="sa-outbox-w7-"))
    data = root / "data"
    log = root / "log"
    port = _free_port()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    try:
        subprocess.run(
            _as_owner([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]),
            check=True,
            capture_output=True,
        )
        options = f"-p {port} -c listen_addresses=127.0.0.1 -k {root} -c logging_collector=off"
        subprocess.run(
            _as_owner(
                [str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(log), *START]
            ),
            check=True,
            capture_output=True,
        )
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run(
                _as_owner([str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                check=False,
                capture_output=True,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
