"""docs/alembic.md, "An existing project with several metadata objects", as written.

A project of its own in ``tmp_path``: an application that has already migrated its
``orders`` table (on ``Base``) adds the queue's tables on a base of their own
(``QueueBase``) in a schema of their own, with the page's ``env.py`` lines. Autogenerate
must render what the page shows, the upgrade must create the tables there, a second
autogenerate must be empty and the downgrade must leave ``orders`` alone; the page's
"Things to know" are checked too.
"""

from __future__ import annotations

import ast
import importlib
import re
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from alembic import command
from alembic.autogenerate import produce_migrations
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import Script
from sqlalchemy import Engine, ForeignKey, create_engine, inspect, select
from sqlalchemy.exc import NoReferencedTableError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker
from sqlalchemy.schema import CreateSchema, DropSchema

import sa_outbox
from sa_outbox import JobQueue, JobStatus

from .test_alembic import (
    DOC,
    TEMPLATE_CONFIGURE,
    Schemas,
    replace_once,
    search_path_url,
    snippet,
    statements,
    tables,
)


@pytest.fixture
def pg(database_url: str) -> Iterator[Engine]:
    engine = create_engine(database_url)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def schemas(pg: Engine) -> Iterator[Schemas]:
    home = f"alembic_{uuid.uuid4().hex[:12]}"
    names = Schemas(home=home, work=f"{home}_work")
    with pg.begin() as connection:
        connection.execute(CreateSchema(names.home))
    try:
        yield names
    finally:
        with pg.begin() as connection:
            for schema in (names.work, names.home):
                connection.execute(DropSchema(schema, cascade=True, if_exists=True))


SNIPPETS = ("several-app-models", "several-queue-models", "several-env", "several-rendered")


def the_functions(source: str) -> dict[str, list[str]]:
    """``{function name: its statements}`` of a snippet or a migration file."""
    tree = ast.parse(source)
    return {
        node.name: [ast.unparse(s) for s in node.body]
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
    }


class Project:
    """The reader's project: ``PACKAGE/models.py``, ``PACKAGE/queue_models.py``, Alembic."""

    def __init__(self, root: Path, url: str, work: str) -> None:
        self.package = f"myapp_{uuid.uuid4().hex[:12]}"  # unique: imported in this process
        self.root, self.url, self.work = root, url, work
        (root / self.package).mkdir()
        (root / self.package / "__init__.py").write_text("")
        self.write("several-app-models")
        ini = root / "alembic.ini"
        command.init(Config(str(ini)), str(root / "migrations"))
        self.env_py = root / "migrations" / "env.py"
        env = self.env_py.read_text()
        # Alembic's logging setup would disable the loggers of the rest of the test session.
        self.env_py.write_text(
            replace_once(env, "    fileConfig(config.config_file_name)", "    pass")
        )
        self.config = Config(str(ini))
        self.config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))

    def source(self, name: str) -> str:
        return snippet(name).replace("myapp", self.package).replace('"work"', f'"{self.work}"')

    def write(self, name: str) -> None:
        code = self.source(name)
        path = code.splitlines()[0].removeprefix("# ")
        (self.root / path).write_text(code)

    def module(self, name: str) -> ModuleType:
        return importlib.import_module(f"{self.package}.{name}")

    def autogenerate(self, message: str) -> Path:
        script = command.revision(self.config, message=message, autogenerate=True)
        assert isinstance(script, Script)
        return Path(script.path)


@pytest.fixture
def project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database_url: str, schemas: Schemas
) -> Project:
    monkeypatch.syspath_prepend(str(tmp_path))  # sys.path is restored after the test
    return Project(tmp_path, search_path_url(database_url, schemas.home), schemas.work)


def test_an_existing_project_adds_the_queue_on_a_metadata_of_its_own(
    project: Project, pg: Engine, schemas: Schemas
) -> None:
    home, work = schemas.home, schemas.work
    on_page = set(re.findall(r"<!-- snippet: (several-[\w-]+) -->", DOC.read_text()))
    assert on_page == set(SNIPPETS), "a snippet of the section that this test does not run"
    # Before: the application's own history, with Base.metadata alone.
    existing = (
        f"import alembic_ext\nfrom {project.package}.models import Base\n\n"
        "target_metadata = Base.metadata\n"
    )
    source = project.env_py.read_text()
    project.env_py.write_text(replace_once(source, "target_metadata = None\n", existing))
    first = project.autogenerate("orders")
    assert statements(first, "upgrade")[0].startswith("op.create_table('orders'")
    command.upgrade(project.config, "head")
    assert tables(pg, home) == {"orders"}

    # The page's change: the queue's models, and env.py given both metadata objects.
    project.write("several-queue-models")
    setup = project.source("several-env") + "\n\n"
    setup += snippet("env-schemas").replace('"work"', f'"{work}"')
    source = replace_once(project.env_py.read_text(), existing, setup)
    configure = textwrap.indent(snippet("env-configure"), " " * 8)
    project.env_py.write_text(replace_once(source, TEMPLATE_CONFIGURE, configure))

    second = project.autogenerate("job queue and outbox")
    shown = the_functions(project.source("several-rendered").replace("'work'", f"'{work}'"))
    assert statements(second, "upgrade") == shown["upgrade"]
    assert statements(second, "downgrade") == shown["downgrade"]

    create_schema = f'op.execute(sa.schema.CreateSchema("{work}", if_not_exists=True))'
    create_jobs = shown["upgrade"][0]
    second.write_text(
        replace_once(second.read_text(), create_jobs, f"{create_schema}\n    {create_jobs}")
    )
    command.upgrade(project.config, "head")
    assert tables(pg, work) == {"jobs", "outbox"}
    assert tables(pg, home) == {"orders"}
    assert "alembic_version" in inspect(pg).get_table_names(schema=home)

    third = project.autogenerate("nothing to do")
    assert statements(third, "upgrade") == ["pass"]
    assert statements(third, "downgrade") == ["pass"]
    third.unlink()

    one_session_with_both_bases(project)

    command.downgrade(project.config, "-1")
    assert tables(pg, work) == set()
    assert tables(pg, home) == {"orders"}


def one_session_with_both_bases(project: Project) -> None:
    """An Order of Base, a job and a domain event of QueueBase: one transaction."""
    models, queue_models = project.module("models"), project.module("queue_models")

    class OrderPlaced(queue_models.OutboxEvent):  # type: ignore[misc,name-defined]
        order: models.Order  # type: ignore[name-defined]
        email: str

    engine = create_engine(project.url)
    try:
        factory = sessionmaker(engine)
        sa_outbox.install(factory, job_model=queue_models.Job)
        with factory() as session, session.begin():
            order = models.Order(email="ana@example.com")
            session.add(order)
            session.add(OrderPlaced(order=order, email=order.email))
            session.flush()
            order_id = order.id
            sa_outbox.enqueue(session, "send-receipt", {"order_id": order_id})
        outbox = queue_models.OutboxEvent.__table__
        with engine.connect() as conn:
            found = conn.execute(select(outbox.c.aggregate_type, outbox.c.aggregate_id)).all()
            assert [tuple(row) for row in found] == [("Order", str(order_id))]
            assert JobQueue(queue_models.Job).counts(conn)[JobStatus.PENDING] == 1
    finally:
        engine.dispose()


def test_a_table_in_two_metadata_objects_is_refused(
    project: Project, pg: Engine, schemas: Schemas
) -> None:
    project.write("several-queue-models")
    queue_models = project.module("queue_models")

    class OtherBase(DeclarativeBase):
        pass

    class SameJobs(queue_models.JobMixin, OtherBase):  # type: ignore[misc,name-defined]
        __tablename__ = "jobs"
        __table_schema__ = schemas.work

    metadata = [queue_models.QueueBase.metadata, OtherBase.metadata]
    with pg.connect() as conn:
        context = MigrationContext.configure(conn, opts={"target_metadata": metadata})
        message = f'Duplicate table keys across multiple MetaData objects: "{schemas.work}.jobs"'
        with pytest.raises(ValueError, match=message):
            # A list, as env.py's target_metadata is (annotated MetaData, documented both).
            produce_migrations(context, metadata)  # type: ignore[arg-type]


def test_a_foreign_key_to_another_metadata_does_not_resolve(project: Project) -> None:
    project.write("several-queue-models")
    queue_models = project.module("queue_models")

    class Receipt(queue_models.QueueBase):  # type: ignore[misc,name-defined]
        __tablename__ = "receipts"
        __table_args__ = {"schema": project.work}  # noqa: RUF012
        id: Mapped[int] = mapped_column(primary_key=True)
        order_id: Mapped[int] = mapped_column(ForeignKey("orders.id"))

    [foreign_key] = Receipt.__table__.foreign_keys
    with pytest.raises(NoReferencedTableError, match="orders"):
        foreign_key.column  # noqa: B018  (resolving it is what fails)
