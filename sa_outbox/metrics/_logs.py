"""`JsonFormatter`: log records as one JSON object a line, their ``extra=`` fields included."""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

__all__ = ["JsonFormatter"]

# The attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """Format each record as one JSON line: ``time``, ``level``, ``logger``, ``message``,
    then the record's ``extra=`` fields (a job's outcome line carries ``job_id``, ``kind``,
    ``queue``, ``attempt``, ``lease_token``, ``outcome``, ``duration`` and ``error``, and
    ``trace_id`` when the job carries a trace context).

    Examples:
        >>> record = logging.LogRecord("sa_outbox.worker", logging.INFO, "", 0,
        ...                            "job %s done", ("42",), None)
        >>> record.kind = "send-email"
        >>> line = json.loads(JsonFormatter().format(record))
        >>> line["message"], line["kind"], line["level"]
        ('job 42 done', 'send-email', 'INFO')
    """

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                data[key] = value
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)
