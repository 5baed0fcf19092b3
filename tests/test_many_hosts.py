"""Many worker hosts, one PostgreSQL (issue 15).

Each worker runs in a network namespace of its own (``ip netns``), joined to the root
namespace by a veth pair on a private /30 (10.200.N.0/30), and reaches a throwaway cluster
that listens on the veth addresses (the shared server listens on 127.0.0.1 only and is never
restarted). Mid-run one host's network is cut by taking its veth down on the server's side:
its packets are dropped in silence (no reset, no error), as behind a dead switch.

What must hold: the cut-off host's leases expire and the other hosts reclaim and finish its
jobs; it notices the dead network within a bound (its libpq keepalives and
``tcp_user_timeout``, here shortened in the URL so the test stays short) instead of hanging;
once the network is back its late results are refused by the lease tokens; every job
succeeded exactly once, by the token of its last claim (the audit tables of
`tests.worker_app` count it). Needs root and ``ip``; skipped elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text

from sa_outbox import JobQueue
from sa_outbox.statements import NewJob

from .clusters import cluster
from .helpers import wait_until
from .worker_app import SCHEMA, Job, create_schema

ROOT = Path(__file__).resolve().parent.parent
HOSTS = 3
JOBS = 300
LEASE = 2.0
WAIT = 30.0
#: The server finds a silent client dead after 1 + 2·1 s with the keepalives below.
LOCKS_WAIT = 12.0
PREFIX = f"sah{os.getpid() % 10000}"
#: libpq's own timeouts, in the URL so that the LISTEN connection has them too: a silent
#: peer is found dead after 1 + 2·1 s of waiting, an unacknowledged send after 3 s.
NET = "connect_timeout=2&keepalives=1&keepalives_idle=1&keepalives_interval=1"
NET += "&keepalives_count=2&tcp_user_timeout=3000"


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True)


def _netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"{PREFIX}probe"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"ip netns add failed: {exc.stderr.decode().strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=False, capture_output=True)
    return None


@contextlib.contextmanager
def _namespaces() -> Iterator[list[tuple[str, str, str]]]:
    """(namespace, host-side veth, server address) per host; all removed afterwards."""
    made: list[tuple[str, str, str]] = []
    try:
        for n in range(1, HOSTS + 1):
            ns, outside, inside = f"{PREFIX}n{n}", f"{PREFIX}o{n}", f"{PREFIX}i{n}"
            server, worker = f"10.200.{n}.1", f"10.200.{n}.2"
            _ip("netns", "add", ns)
            made.append((ns, outside, server))
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", ns)
            _ip("addr", "add", f"{server}/30", "dev", outside)
            _ip("link", "set", outside, "up")
            _ip("-n", ns, "addr", "add", f"{worker}/30", "dev", inside)
            _ip("-n", ns, "link", "set", inside, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield made
    finally:
        for ns, outside, _ in made:
            subprocess.run(["ip", "link", "del", outside], check=False, capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


@pytest.fixture(scope="module")
def hosts() -> Iterator[tuple[list[tuple[str, str, str]], int]]:
    reason = _netns_unavailable()
    if reason is not None:
        pytest.skip(reason)
    with _namespaces() as made:
        listen = ["127.0.0.1", *(server for _, _, server in made)]
        with cluster(listen=listen, hba=["host all all 10.200.0.0/16 trust"]) as node:
            yield made, node.port


@pytest.fixture
def local(hosts: tuple[list[tuple[str, str, str]], int]) -> Iterator[Engine]:
    """An engine on the throwaway cluster over loopback, disposed even when the test fails
    (a pooled connection left to the garbage collector fails a later test with a
    ResourceWarning)."""
    engine = create_engine(f"postgresql+psycopg://postgres@127.0.0.1:{hosts[1]}/postgres")
    try:
        yield engine
    finally:
        engine.dispose()


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_host_cut_off_mid_run_loses_its_jobs_to_the_others_and_writes_nothing_late(
    hosts, local, tmp_path
):
    made, port = hosts
    create_schema(local)
    queue = JobQueue(Job)
    with local.begin() as conn:
        queue.enqueue_many(conn, [NewJob("hold", {"seconds": 0.1}) for _ in range(JOBS)])
    ledger = tmp_path / "ledger"
    env = {**os.environ, "SA_OUTBOX_WORKER_SCHEMA": SCHEMA, "PYTHONPATH": str(ROOT)}
    env["SA_OUTBOX_WORKER_LEDGER"] = str(ledger)
    processes: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    try:
        for n, (ns, _, server) in enumerate(made, start=1):
            url = f"postgresql+psycopg://postgres@{server}:{port}/postgres"
            url += f"?application_name=host{n}&{NET}"
            command = ["ip", "netns", "exec", ns, sys.executable, "-m", "tests.worker_app"]
            command += ["--mode", "run", "--lease", str(LEASE), "--poll-interval", "0.2"]
            command += ["--worker-id", f"host{n}", "--concurrency", "4", "--database-url", url]
            logs.append(tmp_path / f"host{n}.log")
            with logs[-1].open("ab") as out:
                processes.append(
                    subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=out)
                )
        victim, victim_log = processes[0], logs[0]
        ns, outside, _ = made[0]
        restored = False

        wait_until(
            lambda: len(runs_of_pid(ledger, victim.pid)) >= 10, "the first host to run jobs", WAIT
        )
        _ip("link", "set", outside, "down")  # silent: packets to and from host1 are dropped
        cut_at = len(_lines(ledger))

        def done() -> bool:
            with local.connect() as conn:
                return bool(
                    conn.execute(
                        text(f"SELECT count(*) = :n FROM {SCHEMA}.jobs WHERE status = 'succeeded'"),
                        {"n": JOBS},
                    ).scalar_one()
                )

        wait_until(done, "the other hosts to finish every job", WAIT)
        # The cut-off host did not hang in a statement: libpq's timeouts failed it.
        wait_until(
            lambda: "OperationalError" in victim_log.read_text(),
            "the cut-off host to see its connection fail",
            WAIT,
        )
        assert victim.poll() is None, victim_log.read_text()
        _ip("link", "set", outside, "up")
        restored = True
        # Back on the network it writes the results it kept; the tokens refuse them all.
        wait_until(
            lambda: "lease lost before its result" in victim_log.read_text(),
            "the cut-off host's late results to be refused",
            WAIT,
        )
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process, log in zip(processes, logs, strict=True):
            assert process.wait(WAIT) == 0, log.read_text()
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        if not restored:
            _ip("link", "set", outside, "up")
    with local.connect() as conn:
        statuses = dict(
            conn.execute(text(f"SELECT status, count(*) FROM {SCHEMA}.jobs GROUP BY status")).all()
        )
        completions = conn.execute(
            text(f"SELECT job_id::text, token::text, worker_id FROM {SCHEMA}.completions")
        ).all()
        last_claims = dict(
            conn.execute(
                text(
                    f"SELECT DISTINCT ON (job_id) job_id::text, token::text "
                    f"FROM {SCHEMA}.claims ORDER BY job_id, seq DESC"
                )
            ).all()
        )
        names = set(
            conn.execute(text(f"SELECT DISTINCT worker_id FROM {SCHEMA}.completions")).scalars()
        )
    assert statuses == {"succeeded": JOBS}
    # Exactly once, each by the token of its last claim: no stale completion got through.
    assert len(completions) == JOBS
    assert len({job_id for job_id, _, _ in completions}) == JOBS
    assert all(token == last_claims[job_id] for job_id, token, _ in completions)
    # The cut-off host held jobs that the others claimed again and finished.
    victim_tokens = {run[1] for run in runs_of_pid(ledger, victim.pid)}
    completed_tokens = {token for _, token, _ in completions}
    reclaimed = [
        job_id
        for job_id, token in last_claims.items()
        if token not in victim_tokens and job_id in victim_jobs(ledger, victim.pid)
    ]
    assert reclaimed, "no job of the cut-off host was reclaimed by another"
    late = [run for run in _lines(ledger)[cut_at:] if run.split()[3] == str(victim.pid)]
    assert not ({run.split()[1] for run in late} & completed_tokens)
    assert names <= {"host1", "host2", "host3"} and {"host2", "host3"} <= names


def runs_of_pid(ledger: Path, pid: int) -> list[list[str]]:
    return [line.split() for line in _lines(ledger) if line.split()[3] == str(pid)]


def victim_jobs(ledger: Path, pid: int) -> set[str]:
    return {run[0] for run in runs_of_pid(ledger, pid)}


#: A host that claims a job inside a transaction and then goes silent before its COMMIT,
#: as a worker whose write (results and the next claim, one transaction) is cut mid-way.
CUT_MID_TRANSACTION = """
import sys
from sqlalchemy import create_engine
from sa_outbox import JobQueue, connect_args
from tests.worker_app import Job
from sa_outbox._connect_args import harden
args = connect_args(keepalives_idle=1, keepalives_interval=1, keepalives_count=2)
args["tcp_user_timeout"] = 3000  # on Linux it also bounds the keepalives' verdict
engine = create_engine(sys.argv[1], connect_args=args)
if sys.argv[2] == "worker-engine":
    harden(engine)  # what the worker, the relay and the maintenance runners do
conn = engine.connect()
conn.begin()
print(len(JobQueue(Job).claim(conn, worker_id="host1", batch=10, lease=1)), flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize(
    "keepalives",
    [
        pytest.param(
            "client-keepalives",
            marks=pytest.mark.xfail(
                strict=True,
                reason="an engine the library was not handed: connect_args() sets the "
                "client's keepalives only, and the server keeps a dead host's transaction "
                "(and its row locks) until its own TCP keepalives (the OS default: 2 h) "
                "find it dead",
            ),
        ),
        "worker-engine",
    ],
)
def test_a_host_cut_off_inside_a_transaction_does_not_keep_its_locks(hosts, local, keepalives):
    # The server knows nothing of a dead client: a backend idle in a transaction waits for
    # the next statement for as long as its own TCP keepalives allow (the operating
    # system's: two hours), its row locks held, the jobs invisible to every SKIP LOCKED.
    # The server's tcp_keepalives_* for the session bound that: an engine handed to the
    # worker sets them when it connects, to the client's values.
    made, port = hosts
    create_schema(local)
    queue = JobQueue(Job)
    with local.begin() as conn:
        queue.enqueue_many(conn, [NewJob("noop", {}) for _ in range(3)])
    ns, outside, server = made[0]
    inside = outside.replace(f"{PREFIX}o", f"{PREFIX}i")
    url = f"postgresql+psycopg://postgres@{server}:{port}/postgres?application_name=host1"
    env = {**os.environ, "SA_OUTBOX_WORKER_SCHEMA": SCHEMA, "PYTHONPATH": str(ROOT)}
    command = [
        "ip",
        "netns",
        "exec",
        ns,
        sys.executable,
        "-c",
        CUT_MID_TRANSACTION,
        url,
        keepalives,
    ]
    host = subprocess.Popen(
        command, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert host.stdout is not None
        assert host.stdout.readline().strip() == b"3"
        # Down on the host's side: the server keeps its route, and its packets to the host
        # (keepalive probes) vanish in silence, as behind a dead switch.
        _ip("-n", ns, "link", "set", inside, "down")
        host.kill()  # its FIN is not sent either: the server is never told
        host.wait()
        claimed: list[object] = []

        def claim_elsewhere() -> bool:
            with local.begin() as conn:
                claimed.extend(queue.claim(conn, worker_id="host2", batch=10, lease=30))
            return len(claimed) == 3

        wait_until(claim_elsewhere, "the dead host's locks to be released", LOCKS_WAIT)
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
        _ip("-n", ns, "link", "set", inside, "up")
        for pipe in (host.stdin, host.stdout):
            if pipe is not None:
                pipe.close()
    with local.connect() as conn:
        statuses = dict(
            conn.execute(text(f"SELECT status, count(*) FROM {SCHEMA}.jobs GROUP BY status")).all()
        )
    assert statuses == {"running": 3}
