"""Layer 4, maintenance: keep the tables small and healthy while the queue runs.

May import: ``sa_outbox.queue``, ``sa_outbox.statements``, ``sa_outbox.schema`` and the
foundation modules. The worker and the relay run these on a schedule; the CLI runs them by
hand; none of them is imported from here.

- ``_retention``: `Pruner` / `AsyncPruner`, batched deletes of finished rows;
- ``_vacuum``: `Vacuumer` / `AsyncVacuumer`, VACUUM past a dead-tuple threshold;
- ``_partitions``: `maintain_partitions`, partitions created ahead and dropped whole;
- ``_health``: `table_health`, what a table's size, dead tuples and xmin holders say.

Examples:
    >>> Retention(succeeded=7 * 86400, failed=None).succeeded
    datetime.timedelta(days=7)
"""

from ._health import HealthReport, PartitionHealth, TableHealth, XminHolder, table_health
from ._partitions import PartitionReport, amaintain_partitions, maintain_partitions
from ._retention import AsyncPruner, Pruner, PruneReport, Retention
from ._vacuum import AsyncVacuumer, Vacuumer, VacuumPolicy, VacuumReport

__all__ = [
    "AsyncPruner",
    "AsyncVacuumer",
    "HealthReport",
    "PartitionHealth",
    "PartitionReport",
    "PruneReport",
    "Pruner",
    "Retention",
    "TableHealth",
    "VacuumPolicy",
    "VacuumReport",
    "Vacuumer",
    "XminHolder",
    "amaintain_partitions",
    "maintain_partitions",
    "table_health",
]
