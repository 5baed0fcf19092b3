"""Throwaway PostgreSQL clusters for the tests that crash, cut off or fail over a server.

The shared server is never restarted mid-suite: a test that needs to kill PostgreSQL starts a
cluster of its own with the server binaries on this machine (``initdb``, ``pg_ctl``,
``pg_basebackup``), on a free port and a temporary directory, run as the ``postgres`` user
when the tests run as root. Without those binaries the test skips with the reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest


def bindir() -> Path | None:
    """The directory of the newest ``initdb`` / ``pg_ctl`` on this machine, if any."""
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists() and (candidate / "pg_ctl").exists():
            return candidate
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _as_owner(argv: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root; as any other user the command runs as it is.
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Cluster:
    """One running (or stopped) throwaway cluster: its binaries, directory and port."""

    bin: Path
    root: Path
    port: int
    options: str

    @property
    def data(self) -> Path:
        return self.root / "data"

    def run(self, *argv: str) -> None:
        subprocess.run(
            _as_owner([str(self.bin / argv[0]), *argv[1:]]), check=True, capture_output=True
        )

    def start(self) -> None:
        log = str(self.root / "log")
        self.run("pg_ctl", "-D", str(self.data), "-o", self.options, "-l", log, "-w", "start")

    def kill(self) -> None:
        """Stops the server at once, as a crash would (``-m immediate``: no checkpoint)."""
        self.run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def promote(self) -> None:
        """Turns a standby into a primary and waits until it accepts writes."""
        self.run("pg_ctl", "-D", str(self.data), "-w", "promote")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def log(self) -> str:
        path = self.root / "log"
        return path.read_text() if path.exists() else ""


def _options(port: int, root: Path, listen: Sequence[str], settings: Mapping[str, str]) -> str:
    pairs = {"listen_addresses": ",".join(listen), "logging_collector": "off", **settings}
    return f"-p {port} -k {root} " + " ".join(f"-c {k}={v}" for k, v in pairs.items())


@contextlib.contextmanager
def _directory(prefix: str) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        if os.geteuid() == 0:
            shutil.chown(root, "postgres")
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _binaries() -> Path:
    found = bindir()
    if found is None:
        pytest.skip("initdb / pg_ctl not found: cannot start a throwaway PostgreSQL cluster")
    return found


@contextlib.contextmanager
def _running(node: Cluster) -> Iterator[Cluster]:
    """``node`` started, and killed after (if it still runs)."""
    node.start()
    try:
        yield node
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            node.kill()


@contextlib.contextmanager
def cluster(
    *,
    listen: Sequence[str] = ("127.0.0.1",),
    hba: Sequence[str] = (),
    settings: Mapping[str, str] | None = None,
) -> Iterator[Cluster]:
    """A new cluster (trust auth, user ``postgres``), started; killed and removed after.

    ``listen`` are the addresses it listens on, ``hba`` extra ``pg_hba.conf`` lines,
    ``settings`` server settings given on the command line.
    """
    binaries = _binaries()
    with _directory("sa-outbox-pg-") as root:
        port = _free_port()
        node = Cluster(binaries, root, port, _options(port, root, listen, settings or {}))
        node.run("initdb", "-D", str(node.data), "-A", "trust", "-U", "postgres")
        with (node.data / "pg_hba.conf").open("a") as lines:
            lines.writelines(f"{line}\n" for line in hba)
        with _running(node):
            yield node


@contextlib.contextmanager
def standby(primary: Cluster, *, name: str = "standby") -> Iterator[Cluster]:
    """A streaming standby of ``primary`` (``pg_basebackup -R``), started and caught up.

    It connects as ``application_name=name``: listing that name in the primary's
    ``synchronous_standby_names`` makes every commit wait until the standby has it.
    """
    with _directory("sa-outbox-standby-") as root:
        port = _free_port()
        node = Cluster(primary.bin, root, port, _options(port, root, ["127.0.0.1"], {}))
        source = f"host=127.0.0.1 port={primary.port} user=postgres application_name={name}"
        node.run("pg_basebackup", "-D", str(node.data), "-d", source, "-X", "stream", "-R")
        with _running(node):
            yield node


def wait_streaming(primary_url: str, name: str) -> None:
    """Waits until ``name`` streams from the primary as a synchronous standby."""
    from sqlalchemy import create_engine, text

    from .helpers import wait_until

    engine = create_engine(primary_url)
    query = text("SELECT sync_state FROM pg_stat_replication WHERE application_name = :n")

    def in_sync() -> bool:
        with engine.connect() as conn:
            return conn.execute(query, {"n": name}).scalar() == "sync"

    try:
        wait_until(in_sync, f"standby {name!r} streaming in sync", timeout=30.0)
    finally:
        engine.dispose()
