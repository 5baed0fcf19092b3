"""A throwaway PgBouncer in transaction mode, in front of the test server.

`start_pgbouncer` writes an ini and an auth file in a folder of its own, starts the
``pgbouncer`` binary on a free loopback port (as ``postgres`` when run as root: PgBouncer
refuses root), waits until it answers, and returns the URL through it. The server pool is
small (2 connections) so that client connections really share server connections, as they
do in production. Tests skip, with the reason, where the binary is absent.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from sqlalchemy.engine import URL, make_url

#: Debian's package puts it in /usr/sbin, which a user's PATH may not hold.
CANDIDATES = ("pgbouncer", "/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer")


def pgbouncer_binary() -> str | None:
    for candidate in CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def start_pgbouncer(server_url: str) -> Iterator[URL]:
    """PgBouncer (transaction mode) in front of ``server_url``; yields the URL through it.

    Its files are in a folder of its own under the system's temporary folder (not pytest's,
    which only root may enter when PgBouncer runs as ``postgres``), removed afterwards.
    """
    folder = Path(tempfile.mkdtemp(prefix="sa-outbox-pgbouncer-"))
    try:
        with _started(server_url, folder) as url:
            yield url
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def _started(server_url: str, folder: Path) -> Iterator[URL]:
    binary = pgbouncer_binary()
    if binary is None:
        raise FileNotFoundError("pgbouncer is not installed (apt-get install pgbouncer)")
    server = make_url(server_url)
    if not server.host or server.host.startswith("/"):
        raise ValueError(f"the test server must be reached over TCP, got {server_url!r}")
    port = _free_port()
    user = server.username or "postgres"
    (folder / "users.txt").write_text(f'"{user}" "{server.password or ""}"\n')
    password = f" password={server.password}" if server.password else ""
    (folder / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={server.host} port={server.port or 5432}{password}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {folder / 'users.txt'}\n"
        "pool_mode = transaction\n"
        "default_pool_size = 2\n"
        "max_client_conn = 200\n"
        f"logfile = {folder / 'pgbouncer.log'}\n"
        f"pidfile = {folder / 'pgbouncer.pid'}\n"
    )
    command = [binary, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:
        account = pwd.getpwnam("postgres")
        os.chown(folder, account.pw_uid, account.pw_gid)
        for name in ("users.txt", "pgbouncer.ini"):
            os.chown(folder / name, account.pw_uid, account.pw_gid)
        command[1:1] = ["-u", "postgres"]
    with open(folder / "stderr.txt", "wb") as stderr:
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True
        )
    url = server.set(host="127.0.0.1", port=port)
    try:
        _wait_until_up(process, url, folder)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_until_up(process: subprocess.Popen[bytes], url: URL, folder: Path) -> None:
    conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
    deadline = time.monotonic() + 20
    while True:
        if process.poll() is not None:
            log = folder / "pgbouncer.log"
            detail = log.read_text() if log.exists() else ""
            stderr = (folder / "stderr.txt").read_text()
            raise RuntimeError(f"pgbouncer exited at start: {stderr}{detail}")
        try:
            with psycopg.connect(conninfo, connect_timeout=2, autocommit=True) as conn:
                conn.execute("SELECT 1")
                return
        except psycopg.OperationalError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)  # polling a process that is starting, not synchronising tests
