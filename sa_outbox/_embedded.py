"""An embedded PostgreSQL for demos, examples and tests on a machine with no server.

The server is the ``pgserver`` package's PostgreSQL (``pip install "sa-outbox[embedded]"``),
listening on a Unix socket; with ``tcp=True`` also on a free port of 127.0.0.1 (for a
client that needs TCP: a proxy, PgBouncer). `embedded_database_url` starts one of two kinds:

- **temporary** (no ``data_dir``): a fresh folder under the temporary directory, for this
  process (and the processes it forks) alone. It is stopped and deleted when the process
  ends, however it ends: at a normal exit by the process itself; killed by a signal
  (SIGTERM, SIGINT, SIGHUP, even SIGKILL) by a small watcher process started with it.
- **shared** (``data_dir``): the server whose files live in ``data_dir``. The first
  process starts it, the next ones (in other terminals: a web process and its worker)
  join it. It is stopped when the last process using it ends, however it ends, and
  ``data_dir`` is kept, data included, for the next run: delete the folder to drop it.

Every process that uses a server holds a shared lock (``fcntl`` record lock) on
``data_dir/sa-outbox.lock`` while it lives; the kernel releases it however the process ends,
before the watcher's pipe reports the end. Whoever then finds no other holder, the process
itself at exit or its watcher after it died, stops the server. Creating or starting the
server is done under an exclusive lock on ``data_dir/sa-outbox.start.lock``, one process at
a time: two started together would otherwise both run ``initdb``.

Examples:
    url = embedded_database_url()  # temporary: gone with this process
    url.startswith("postgresql+psycopg://postgres@/postgres?host=")
    # -> True
    shared = embedded_database_url("instance/pgdata")  # kept; the server stops with its last user
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import errno
import importlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ._exceptions import SaOutboxError

if sys.platform != "win32":
    import fcntl

__all__ = ["embedded_database_url"]

#: The file whose shared locks say which processes use a server, in its folder.
LOCK_FILE = "sa-outbox.lock"
#: The file whose exclusive lock lets one process at a time create or start a server.
START_LOCK_FILE = "sa-outbox.start.lock"
#: The server's own data directory, in its folder.
PGDATA = "pgdata"


@dataclasses.dataclass
class _Joined:
    """A server this process uses: its URL, and what keeps it (and its clean-up) alive."""

    socket_url: str
    tcp_url: str | None
    root: Path
    temporary: bool
    pg_ctl: Path
    lock_fd: int  # holds the shared lock while this process lives
    alive_fd: int  # the write end of the watcher's stdin: closed when this process ends
    watcher: subprocess.Popen[bytes]


#: What the watcher process runs (``-c``, not ``-m``: the package imports this module).
_WATCHER = f"import sys; from {__name__} import _watch; _watch(sys.argv[1:])"

_joined: dict[Path, _Joined] = {}
_guard = threading.Lock()
_hooks_installed = False
#: The pipe a fork's parent waits on until the child took its locks (see `_before_fork`).
_fork_handshake: tuple[int, int] | None = None


def embedded_database_url(data_dir: str | Path | None = None, *, tcp: bool = False) -> str:
    """Start (or join) an embedded PostgreSQL and return its SQLAlchemy URL.

    Without ``data_dir``, a temporary server of this process's own: stopped and its folder
    deleted when the process ends, normally or by a signal. With ``data_dir``, the server
    whose files live there (the folder is created if missing): started if no process runs
    it yet, joined if one does; stopped when the last process using it ends, however it
    ends, while ``data_dir`` and its data are kept for the next run (delete the folder to
    drop them). Linux and macOS; needs ``pip install "sa-outbox[embedded]"``.

    The URL names the server's Unix socket. With ``tcp=True`` the server also listens on a
    free port of 127.0.0.1 and the URL names that port, for a client that cannot use a
    socket (a TCP proxy, PgBouncer). Like the socket, the port trusts every local user: it
    is for a developer's machine and tests, never for a shared host.

    Examples:
        url = embedded_database_url()
        url.startswith("postgresql+psycopg://")
        # -> True
    """
    pgserver = _pgserver()
    with _guard:
        if data_dir is None:
            root = Path(tempfile.mkdtemp(prefix="sa-outbox-pg-"))
        else:
            root = Path(data_dir).expanduser().resolve()
            if root in _joined:
                return _url(_joined[root], root, tcp=tcp)
            try:
                root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise SaOutboxError(
                    f"cannot create the embedded PostgreSQL's folder {root}: {exc.strerror}"
                ) from exc
        joined = _join(pgserver, root, temporary=data_dir is None, tcp=tcp)
        _joined[root] = joined
        return _url(joined, root, tcp=tcp)


def _url(joined: _Joined, root: Path, *, tcp: bool) -> str:
    if not tcp:
        return joined.socket_url
    if joined.tcp_url is None:
        raise SaOutboxError(
            f"the embedded PostgreSQL in {root} was started without TCP by another process: "
            "stop the processes that use it, or call embedded_database_url(tcp=True) in the first"
        )
    return joined.tcp_url


def _pgserver() -> Any:
    if sys.platform == "win32":  # pragma: no cover - the test machines are Linux
        raise SaOutboxError(
            "the embedded PostgreSQL runs on Linux and macOS only: pass a database URL"
        )
    with warnings.catch_warnings():
        # platformdirs (imported by pgserver) warns when XDG_RUNTIME_DIR is unset, as in CI
        # and containers; harmless here.
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module("pgserver")
        except ImportError as exc:
            if sys.version_info >= (3, 13):
                raise SaOutboxError(
                    "no database URL was given and the embedded PostgreSQL (pgserver) has no "
                    f"build for Python {sys.version_info[0]}.{sys.version_info[1]}: pass a URL"
                ) from exc
            raise SaOutboxError(
                "no database URL was given and the embedded PostgreSQL is not installed: "
                'pass a URL, or install it with pip install "sa-outbox[embedded]"'
            ) from exc


def _join(pgserver: Any, root: Path, *, temporary: bool, tcp: bool) -> _Joined:
    global _hooks_installed
    pg_ctl = Path(pgserver.__file__).parent / "pginstall" / "bin" / "pg_ctl"
    lock_fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        # Blocks while a leaving process stops the server; it is started afresh afterwards.
        fcntl.lockf(lock_fd, fcntl.LOCK_SH)
        # The watcher first: if this process dies while the server starts, it cleans up.
        alive_fd, watcher = _start_watcher(root, pg_ctl, temporary=temporary)
    except BaseException:
        os.close(lock_fd)
        raise
    joined = _Joined("", None, root, temporary, pg_ctl, lock_fd, alive_fd, watcher)
    try:
        with _starting(root):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                pgserver.get_server(root / PGDATA, cleanup_mode=None)
            running = _running(root / PGDATA)
            if tcp and not running.hostname and _alone(lock_fd):
                _listen_on_loopback(root / PGDATA, pg_ctl, running)
                running = _running(root / PGDATA)
    except BaseException:
        _leave(joined)
        raise
    port = "" if running.port in (None, 5432) else f"&port={running.port}"
    joined.socket_url = f"postgresql+psycopg://postgres@/postgres?host={running.socket_dir}{port}"
    if running.hostname:
        joined.tcp_url = f"postgresql+psycopg://postgres@{running.hostname}:{running.port}/postgres"
    if not _hooks_installed:
        atexit.register(_leave_all)
        os.register_at_fork(
            before=_before_fork,
            after_in_parent=_after_fork_in_parent,
            after_in_child=_after_fork_in_child,
        )
        _hooks_installed = True
    return joined


@dataclasses.dataclass(frozen=True)
class _Running:
    """What ``postmaster.pid`` says of a running server: where it listens."""

    port: int | None
    socket_dir: str
    hostname: str  # "" when it listens on no TCP address


def _running(pgdata: Path) -> _Running:
    lines = (pgdata / "postmaster.pid").read_text().splitlines()
    port = int(lines[3]) if lines[3].strip() else None
    return _Running(port, lines[4].strip(), lines[5].strip())


def _alone(own_fd: int) -> bool:
    """Whether no other process uses the server (so it may be restarted): this process's
    shared lock converts to an exclusive one only if no other process holds one."""
    try:
        fcntl.lockf(own_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise
    fcntl.lockf(own_fd, fcntl.LOCK_SH)
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _listen_on_loopback(pgdata: Path, pg_ctl: Path, running: _Running) -> None:
    """Restart the server listening on a free port of 127.0.0.1 too, its socket kept."""
    owner = pgdata.stat().st_uid
    options = f"-h 127.0.0.1 -p {_free_port()} -k {running.socket_dir}"
    subprocess.run(
        [
            str(pg_ctl),
            "-D",
            str(pgdata),
            "-m",
            "fast",
            "-w",
            "-o",
            options,
            "-l",
            str(pgdata / "log"),
            "restart",
        ],
        user=owner if os.geteuid() == 0 and owner != 0 else None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=True,
        timeout=60,
    )


@contextlib.contextmanager
def _starting(root: Path) -> Iterator[None]:
    """One process at a time creates or starts the server in ``root``; the next ones join it.

    Two processes started together (a web process and its worker) would otherwise both find
    no ``pgdata`` and both run ``initdb`` in it.
    """
    fd = os.open(root / START_LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def _start_watcher(
    root: Path, pg_ctl: Path, *, temporary: bool
) -> tuple[int, subprocess.Popen[bytes]]:
    read_fd, alive_fd = os.pipe()  # both non-inheritable: only forks of this process share it
    command = [sys.executable, "-c", _WATCHER, str(root), "--pg-ctl", str(pg_ctl)]
    try:
        watcher = subprocess.Popen(
            [*command, *(["--temporary"] if temporary else [])],
            stdin=read_fd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=Path(__file__).resolve().parents[1],  # where this package is importable
            start_new_session=True,  # out of the terminal's reach: Ctrl-C stops us, not it
        )
    except BaseException:
        os.close(alive_fd)
        raise
    finally:
        os.close(read_fd)
    return alive_fd, watcher


def _leave(joined: _Joined) -> None:
    """Let go of a server: stop it (and delete a temporary one) if no other process uses it."""
    try:
        _stop_if_unused(joined.root, joined.pg_ctl, temporary=joined.temporary, fd=joined.lock_fd)
    finally:
        os.close(joined.lock_fd)
        os.close(joined.alive_fd)  # the watcher wakes up, finds nothing left to do, and exits


def _leave_all() -> None:
    with _guard:
        while _joined:
            _leave(_joined.popitem()[1])


def _before_fork() -> None:
    global _fork_handshake
    _fork_handshake = os.pipe() if _joined else None


def _after_fork_in_parent() -> None:
    # Wait until the child holds its locks (it closes the pipe then, or by dying): a parent
    # that returned at once could exit and stop the server before the child locked it.
    global _fork_handshake
    handshake, _fork_handshake = _fork_handshake, None
    if handshake is not None:
        read_fd, write_fd = handshake
        os.close(write_fd)
        try:
            os.read(read_fd, 1)  # end of file: the child is ready
        finally:
            os.close(read_fd)


def _after_fork_in_child() -> None:
    # Record locks belong to a process: a forked child takes its own, so that the server
    # outlives its parent while the child uses it (closing the inherited descriptor first:
    # closing one would drop the child's locks on the file).
    global _fork_handshake
    handshake, _fork_handshake = _fork_handshake, None
    try:
        for joined in _joined.values():
            os.close(joined.lock_fd)
            joined.lock_fd = os.open(joined.root / LOCK_FILE, os.O_RDWR | os.O_CLOEXEC)
            fcntl.lockf(joined.lock_fd, fcntl.LOCK_SH)
    finally:
        if handshake is not None:
            os.close(handshake[0])
            os.close(handshake[1])  # the parent goes on


def _stop_if_unused(root: Path, pg_ctl: Path, *, temporary: bool, fd: int | None = None) -> None:
    """Stop the server in ``root`` (and delete a temporary ``root``) if no process uses it."""
    own = fd is None
    if own:
        try:
            fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return  # deleted already
    assert fd is not None
    try:
        try:  # exclusive only if no other process holds its shared lock
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                return
            raise
        _stop(root / PGDATA, pg_ctl)
        if temporary:
            shutil.rmtree(root, ignore_errors=True)
    finally:
        if own:
            os.close(fd)


def _stop(pgdata: Path, pg_ctl: Path) -> None:
    if not (pgdata / "postmaster.pid").exists():
        return
    # pg_ctl refuses to run as root; pgserver runs the server as the data directory's owner.
    owner = pgdata.stat().st_uid
    subprocess.run(
        [str(pg_ctl), "-D", str(pgdata), "-m", "fast", "-w", "stop"],
        user=owner if os.geteuid() == 0 and owner != 0 else None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )


def _watch(argv: Sequence[str]) -> None:
    """The watcher: wait until every process holding the pipe ended, then clean up."""
    parser = argparse.ArgumentParser(prog="sa-outbox embedded PostgreSQL watcher")
    parser.add_argument("root", type=Path)
    parser.add_argument("--pg-ctl", type=Path, required=True)
    parser.add_argument("--temporary", action="store_true")
    args = parser.parse_args(argv)
    sys.stdin.buffer.read()  # returns at end of file: the write end's last holder is gone
    _stop_if_unused(args.root, args.pg_ctl, temporary=args.temporary)
