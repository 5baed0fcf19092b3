"""The embedded PostgreSQL leaves nothing behind: no folder, no process (issue 17).

Every test runs real processes on real ``pgserver`` servers, with ``TMPDIR`` pointing at a
folder of the test's own, and looks afterwards for the server's folder and for any process
(the server, the watcher) whose command line names it. Waiting is polling another
process's doing with a deadline.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from sa_outbox import SaOutboxError, embedded_database_url
from sa_outbox._embedded import LOCK_FILE, PGDATA
from sa_outbox.cli import ENV_APP_DATABASE_URL, ENV_DATABASE_URL

from .helpers import wait_until

pytest.importorskip("pgserver", reason="the embedded PostgreSQL (the test extra installs it)")
psutil = pytest.importorskip("psutil", reason="pgserver's dependency, to list processes")

ROOT = Path(__file__).resolve().parents[1]

#: A process that uses an embedded server: it prints the URL, then runs each SQL line it
#: reads (printing the first value, or "ok"), until "exit".
USER = textwrap.dedent(
    """
    import sys

    from sqlalchemy import create_engine, text

    import sa_outbox

    url = sa_outbox.embedded_database_url(*sys.argv[1:])
    engine = create_engine(url)
    print(url, flush=True)
    for line in sys.stdin:
        if line.strip() == "exit":
            break
        with engine.begin() as conn:
            result = conn.execute(text(line))
            answer = result.scalar() if result.returns_rows else "ok"
        print(answer, flush=True)  # once committed
    engine.dispose()
    """
)


spawned: list[subprocess.Popen[str]] = []


@pytest.fixture
def place() -> Iterator[Path]:
    """A short folder of the test's own (a Unix socket path must stay under 108 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="emb-", dir="/tmp"))
    (folder / "tmp").mkdir()
    (folder / "run").mkdir(mode=0o700)  # as XDG_RUNTIME_DIR must be (pgserver's lock file)
    yield folder
    for process in spawned:
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()
        if process.poll() is None:
            process.kill()
            process.wait()
    spawned.clear()
    for pgdata in folder.glob(f"**/{PGDATA}"):  # a failed test may leave a server: stop it
        if (pgdata / "postmaster.pid").exists():
            owner = pgdata.stat().st_uid
            pg_ctl = Path(sys.modules["pgserver"].__file__).parent / "pginstall/bin/pg_ctl"
            subprocess.run(
                [str(pg_ctl), "-D", str(pgdata), "-m", "immediate", "stop"],
                user=owner if os.geteuid() == 0 and owner != 0 else None,
                capture_output=True,
                check=False,
            )
    shutil.rmtree(folder, ignore_errors=True)


def env_of(place: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (ENV_DATABASE_URL, ENV_APP_DATABASE_URL)}
    return {**env, "TMPDIR": str(place / "tmp"), "XDG_RUNTIME_DIR": str(place / "run")}


def spawn(place: Path, *args: str, code: str = USER) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=env_of(place),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    spawned.append(process)
    return process


def ask(process: subprocess.Popen[str], line: str) -> str:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(line + "\n")
    process.stdin.flush()
    return process.stdout.readline().strip()


def url_of(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    assert url.startswith("postgresql+psycopg://postgres@/postgres?host="), url
    return url


def folder_of(url: str) -> Path:
    """The server's own folder: the one that holds ``pgdata`` (the socket's folder)."""
    return Path(url.partition("host=")[2].partition("&")[0]).parent


def processes_naming(folder: Path) -> list[str]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if str(folder) in line:
            found.append(line)
    return found


def test_the_demo_leaves_no_folder_and_no_process(place: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sa_outbox", "demo", "--jobs", "20"],
        cwd=ROOT,
        env=env_of(place),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "starting a temporary embedded PostgreSQL" in done.stdout
    assert "jobs       pending 0, running 0, succeeded 20, failed 1" in done.stdout
    assert "stopped and deleted at exit" in done.stdout
    assert list((place / "tmp").iterdir()) == []  # deleted by the demo itself, at exit
    wait_until(lambda: not processes_naming(place / "tmp"), "the server and watcher to end")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL, signal.SIGHUP])
def test_a_killed_process_leaves_no_folder_and_no_process(
    place: Path, signum: signal.Signals
) -> None:
    user = spawn(place)
    folder = folder_of(url_of(user))
    assert ask(user, "SELECT 40 + 2") == "42"
    assert processes_naming(folder)  # the server (and the watcher) run

    user.send_signal(signum)
    assert user.wait(60) == -signum  # no atexit, no finally: the watcher cleans up
    wait_until(lambda: not folder.exists(), "the watcher to delete the folder")
    wait_until(lambda: not processes_naming(folder), "the server and watcher to end")
    assert list((place / "tmp").iterdir()) == []


def test_a_forked_child_keeps_the_server_until_it_ends(place: Path) -> None:
    code = textwrap.dedent(
        """
        import os, sys

        from sqlalchemy import create_engine, text

        import sa_outbox

        url = sa_outbox.embedded_database_url()
        print(url, flush=True)
        if os.fork() == 0:  # the child outlives its parent, then uses the server
            sys.stdin.readline()
            engine = create_engine(url)
            with engine.connect() as conn:
                print(conn.scalar(text("SELECT 7")), flush=True)
            engine.dispose()
            sys.stdin.readline()
        """
    )
    parent = spawn(place, code=code)
    folder = folder_of(url_of(parent))
    assert parent.wait(60) == 0  # its exit did not stop the server: the child still uses it
    assert folder.exists()
    assert ask(parent, "go") == "7"
    assert parent.stdin is not None
    parent.stdin.close()  # the child reads end of file and ends normally
    wait_until(lambda: not folder.exists(), "the child to delete the folder")
    wait_until(lambda: not processes_naming(folder), "the server and watcher to end")


def test_a_shared_server_outlives_one_user_stops_with_the_last_and_keeps_its_data(
    place: Path,
) -> None:
    data_dir = place / "shared"
    web, worker = spawn(place, str(data_dir)), spawn(place, str(data_dir))
    url = url_of(web)
    assert url_of(worker) == url  # the second process joined the first one's server
    assert ask(web, "CREATE TABLE orders (n int)") == "ok"
    assert ask(web, "INSERT INTO orders VALUES (1)") == "ok"

    web.send_signal(signal.SIGTERM)  # one user gone, the hard way
    assert web.wait(60) == -signal.SIGTERM
    assert ask(worker, "INSERT INTO orders VALUES (2)") == "ok"  # the server still runs

    assert ask(worker, "exit") == ""  # the last user leaves: the server stops with it
    assert worker.wait(60) == 0
    wait_until(lambda: not processes_naming(data_dir), "the server and watchers to end")
    assert (data_dir / PGDATA / "PG_VERSION").exists()  # kept, with its data
    assert (data_dir / LOCK_FILE).exists()

    again = spawn(place, str(data_dir))  # the next run starts it again, on the same data
    assert url_of(again) == url
    assert ask(again, "SELECT count(*) FROM orders") == "2"
    assert ask(again, "exit") == ""
    assert again.wait(60) == 0
    wait_until(lambda: not processes_naming(data_dir), "the server to stop again")
    assert list((place / "tmp").iterdir()) == []  # a shared server writes nothing there


def test_a_data_dir_that_cannot_be_created_says_so(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    with pytest.raises(SaOutboxError, match="cannot create the embedded PostgreSQL's folder"):
        embedded_database_url(not_a_folder / "pgdata")


#: `USER` asking for TCP too: ``tcp`` as the first argument, ``data_dir`` as the optional second.
USER_TCP = USER.replace(
    "url = sa_outbox.embedded_database_url(*sys.argv[1:])",
    "url = sa_outbox.embedded_database_url(*sys.argv[2:], tcp=sys.argv[1] == 'tcp')",
)


def test_a_temporary_server_listens_on_loopback_tcp_when_asked(place: Path) -> None:
    user = spawn(place, "tcp", code=USER_TCP)
    assert user.stdout is not None
    url = user.stdout.readline().strip()
    assert url.startswith("postgresql+psycopg://postgres@127.0.0.1:"), url
    assert ask(user, "SHOW listen_addresses") == "127.0.0.1"
    assert ask(user, "SELECT inet_server_addr() IS NOT NULL") == "True"  # over TCP indeed
    folder = Path(ask(user, "SHOW data_directory")).parent
    assert ask(user, "exit") == ""
    assert user.wait(60) == 0
    wait_until(lambda: not folder.exists(), "the folder to be deleted")
    wait_until(lambda: not processes_naming(folder), "the server and watcher to end")


def test_a_shared_server_started_with_tcp_serves_both_urls_to_the_next_users(
    place: Path,
) -> None:
    data_dir = place / "shared"
    first = spawn(place, "tcp", str(data_dir), code=USER_TCP)
    assert first.stdout is not None
    tcp_url = first.stdout.readline().strip()
    assert tcp_url.startswith("postgresql+psycopg://postgres@127.0.0.1:"), tcp_url
    port = tcp_url.rpartition(":")[2].partition("/")[0]
    by_socket = spawn(place, "socket", str(data_dir), code=USER_TCP)
    socket_url = url_of(by_socket)
    assert socket_url.endswith(f"&port={port}")  # the socket's name carries the port
    assert ask(first, "CREATE TABLE t (n int)") == "ok"
    assert ask(by_socket, "SELECT count(*) FROM t") == "0"
    again = spawn(place, "tcp", str(data_dir), code=USER_TCP)
    assert again.stdout is not None
    assert again.stdout.readline().strip() == tcp_url
    for user in (first, by_socket, again):
        assert ask(user, "exit") == ""
        assert user.wait(60) == 0
    wait_until(lambda: not processes_naming(data_dir), "the server and watchers to end")


def test_tcp_on_a_shared_server_another_process_started_without_it_says_so(
    place: Path,
) -> None:
    data_dir = place / "shared"
    first = spawn(place, "socket", str(data_dir), code=USER_TCP)
    url_of(first)
    code = textwrap.dedent(
        """
        import sys
        import sa_outbox
        try:
            sa_outbox.embedded_database_url(sys.argv[1], tcp=True)
        except sa_outbox.SaOutboxError as error:
            print(error)
        """
    )
    found = subprocess.run(
        [sys.executable, "-c", code, str(data_dir)],
        cwd=ROOT,
        env=env_of(place),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert found.returncode == 0, found.stderr
    assert "was started without TCP by another process" in found.stdout
    assert ask(first, "SELECT 1") == "1"  # the first user's server was left alone
    assert ask(first, "exit") == ""
    assert first.wait(60) == 0
    wait_until(lambda: not processes_naming(data_dir), "the server and watchers to end")
