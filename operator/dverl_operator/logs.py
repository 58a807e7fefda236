"""The operator's logs: one JSON object per line (time, level, logger, message, plus any `extra=` fields);
kopf's chatter kept to warnings unless debugging, and the access logs of the HTTP libraries always."""

from __future__ import annotations

import datetime
import json
import logging
import sys

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "settings", "k8s_skip"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, plus any `extra=` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value if isinstance(value, str | int | float | bool | type(None)) else str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # the API client logs every request at info
    if root.level > logging.DEBUG:
        logging.getLogger("kopf").setLevel(logging.WARNING)  # kopf logs every handled event at info
