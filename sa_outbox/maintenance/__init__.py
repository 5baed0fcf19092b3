"""Keep the tables small and healthy while the queue runs.

The worker and the relay run these on a schedule; ``sa-outbox`` runs them by hand.

- `Pruner` / `AsyncPruner`, batched deletes of finished rows;
- `Vacuumer` / `AsyncVacuumer`, VACUUM past a dead-tuple threshold;
- `maintain_partitions`, partitions created ahead and dropped whole;
- `table_health`, what a table's size, dead tuples and xmin holders say.

Examples:
    >>> Retention(succeeded=7 * 86400, failed=None).succeeded
    datetime.timedelta(days=7)
"""

from ._health import HealthReport, PartitionHealth, TableHealth, XminHolder, table_health
from ._partitions import PartitionReport, maintain_partitions
from ._partitions_async import amaintain_partitions
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
