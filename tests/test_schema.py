from __future__ import annotations

from sqlalchemy import Engine, inspect

from .conftest import TEST_SCHEMA


def test_tables_and_indexes_exist(engine: Engine) -> None:
    insp = inspect(engine)
    assert {"jobs", "outbox"} <= set(insp.get_table_names(schema=TEST_SCHEMA))
    names = {i["name"] for i in insp.get_indexes("jobs", schema=TEST_SCHEMA)}
    assert names >= {"jobs_ready_idx", "jobs_dedup_idx", "jobs_expired_lease_idx"}
    enums = {e["name"] for e in insp.get_enums(schema=TEST_SCHEMA)}
    assert "job_status" in enums
