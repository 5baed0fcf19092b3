"""``sa-outbox dashboard``: the real command in a subprocess, serving the dashboard on a free
port; and its bad input, a one-line error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from sqlalchemy import Engine

from sa_outbox import JobQueue

from .conftest import TEST_SCHEMA, Job
from .helpers import assert_one_line_error

pytest.importorskip("flask", reason="the dashboard needs Flask (the test extra has it)")

ROOT = Path(__file__).resolve().parents[1]


def test_the_command_serves_the_dashboard(engine: Engine, database_url: str) -> None:
    queue = JobQueue(Job)
    with engine.begin() as conn:
        queue.enqueue(conn, "ping", {}, max_attempts=1)
    with engine.begin() as conn:
        [job] = queue.claim(conn, worker_id="w", batch=1)
        queue.fail(conn, job.id, job.lease_token, error="boom")
    command = [sys.executable, "-m", "sa_outbox", "dashboard", "--port", "0"]
    command += ["--jobs-table", f"{TEST_SCHEMA}.jobs", "--database-url", database_url]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True) as server:
        try:
            assert server.stdout is not None
            line = server.stdout.readline()  # printed once the port is bound
            assert line.startswith("sa-outbox dashboard on http://127.0.0.1:"), line
            url = line.split()[3]
            # No token given: the command made one and printed the address that carries it.
            opener = server.stdout.readline().split()
            assert opener[0] == "open" and opener[1].startswith(f"{url}?token=")
            token = opener[1].split("?token=")[1]
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"{url}jobs?status=failed", timeout=30)
            assert refused.value.code == 403
            refused.value.close()
            request = urllib.request.Request(
                f"{url}jobs?status=failed", headers={"Authorization": f"Bearer {token}"}
            )
            with urllib.request.urlopen(request, timeout=30) as page:
                html = page.read().decode()
            assert f'data-id="{job.id}"' in html and "boom" in html
        finally:
            server.send_signal(signal.SIGINT)
            assert server.wait(timeout=30) == 0  # Ctrl-C stops the server cleanly


def test_the_access_log_never_shows_the_token(engine: Engine, database_url: str) -> None:
    """werkzeug logs every request ("GET /?token=... 302"): the command's log shows the
    requests, with every ``token=`` value hidden, and the token nowhere."""
    secret = "a-token-for-the-log-test-7f3a9c"
    command = [sys.executable, "-m", "sa_outbox", "dashboard", "--port", "0"]
    command += ["--jobs-table", f"{TEST_SCHEMA}.jobs", "--database-url", database_url]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SA_OUTBOX_DASHBOARD_TOKEN": secret}
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as server:
        try:
            assert server.stdout is not None
            line = server.stdout.readline()
            assert line.startswith("sa-outbox dashboard on http://127.0.0.1:"), line
            url = line.split()[3]
            for path, code in [
                (f"?token={secret}", 302),  # a browser logging in
                (f"jobs?status=failed&token={secret}", 302),
                (f"jobs?TOKEN={secret}", 403),  # not a token parameter: hidden all the same
                ("?token=a-wrong-guess-but-long-enough", 403),
                (f"{secret}", 404),  # in the path, by mistake
            ]:
                opener = urllib.request.build_opener(_NoRedirect)
                with pytest.raises(urllib.error.HTTPError) as answered:
                    opener.open(f"{url}{path}", timeout=30)
                assert answered.value.code == code, path
                answered.value.close()
        finally:
            server.send_signal(signal.SIGINT)
            _, log = server.communicate(timeout=30)
    assert server.returncode == 0
    requests = [line for line in log.splitlines() if '"GET /' in line]
    assert len(requests) == 5, log  # every request is logged
    assert '"GET /?token=<hidden> HTTP/1.1" 302' in log
    assert '"GET /jobs?status=failed&token=<hidden> HTTP/1.1" 302' in log
    assert '"GET /?token=<hidden> HTTP/1.1" 403' in log  # a wrong guess is hidden too
    assert '"GET /<hidden> HTTP/1.1" 404' in log
    assert secret not in log and "a-wrong-guess" not in log


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Answer a redirect as it is (an error carrying its code), not by following it."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def test_the_command_needs_the_job_table(
    capsys: pytest.CaptureFixture[str], database_url: str
) -> None:
    assert_one_line_error(
        capsys,
        ["dashboard", "--database-url", database_url],
        "give the job table: --model myapp.models:Job or --jobs-table SCHEMA.TABLE",
    )
