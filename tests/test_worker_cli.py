"""``sa-outbox worker``: its arguments and how it finds the app (a run is in
test_worker_faults.py, where SIGTERM stops a real ``sa-outbox worker`` process)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sa_outbox import JobApp, cli
from sa_outbox.cli import CommandError, build_parser, load_target, main


def test_the_issue_command_line_parses() -> None:
    args = build_parser().parse_args(
        ["worker", "myapp.tasks:app", "--queues", "default,emails", "--concurrency", "16"]
    )
    assert (args.target, args.queues, args.concurrency, args.listen, args.reclaim) == (
        "myapp.tasks:app",
        ["default", "emails"],
        16,
        True,
        True,
    )
    args = build_parser().parse_args(["worker", "m:a", "--no-listen", "--no-reclaim"])
    assert (args.listen, args.reclaim, args.queues) == (False, False, None)


def test_batch_and_prefetch_parse_and_default_to_the_workers_own_defaults() -> None:
    args = build_parser().parse_args(["worker", "m:a"])
    assert (args.batch, args.prefetch) == (None, None)  # Worker's defaults: 50, adaptive
    args = build_parser().parse_args(["worker", "m:a", "--batch", "100", "--prefetch", "0"])
    assert (args.batch, args.prefetch) == (100, 0)


def test_the_worker_help_states_the_batch_and_prefetch_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["worker", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--prefetch N" in out
    assert "(default: 50, or --concurrency if larger)" in out
    assert "(default: adaptive" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["worker"],
        ["worker", "m:a", "--concurrency", "0"],
        ["worker", "m:a", "--queues", "a,,b"],
        ["worker", "m:a", "--lease", "soon"],
        ["worker", "m:a", "--prefetch", "-1"],
        ["worker", "m:a", "--prefetch", "some"],
    ],
)
def test_bad_arguments_are_usage_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "usage: sa-outbox worker" in capsys.readouterr().err


@pytest.fixture
def tasks_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"tasks_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            from sqlalchemy.orm import DeclarativeBase
            from sa_outbox import JobApp, JobMixin

            class Base(DeclarativeBase):
                pass

            class Job(JobMixin, Base):
                __tablename__ = "jobs"

            app = JobApp(Job, handlers={"ping": print})

            def create_app():
                return app

            class Holder:
                app = app

            not_an_app = 42
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_load_target_finds_the_app_a_factory_or_a_dotted_attribute(tasks_module: str) -> None:
    app = load_target(f"{tasks_module}:app")
    assert isinstance(app, JobApp) and app.kinds == ("ping",)
    assert load_target(f"{tasks_module}:create_app") is app
    assert load_target(f"{tasks_module}:Holder.app") is app


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no-colon", "expected TARGET as module:attribute"),
        ("no_such_module_here:app", "cannot import 'no_such_module_here'"),
        ("{module}:missing", "has no attribute 'missing'"),
        ("{module}:not_an_app", "is not a JobApp"),
    ],
)
def test_load_target_says_what_is_wrong(tasks_module: str, target: str, message: str) -> None:
    with pytest.raises(CommandError, match=message):
        load_target(target.format(module=tasks_module))


def test_the_worker_needs_a_database_url(
    tasks_module: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(cli.ENV_DATABASE_URL, raising=False)
    monkeypatch.delenv(cli.ENV_APP_DATABASE_URL, raising=False)
    assert main(["worker", f"{tasks_module}:app", "--log-level", "ERROR"]) == 1
    assert "give the database with --database-url" in capsys.readouterr().err
    assert main(["worker", f"{tasks_module}:app", "--database-url", "sqlite://"]) == 1
    assert "sa-outbox needs PostgreSQL" in capsys.readouterr().err
