"""Structured logs for the long-running processes: one JSON object per line on stderr, so a
log shipper can index level, logger and message without parsing prose."""

from __future__ import annotations

import json
import logging
import sys
import time

__all__ = ["configure"]


class _JsonFormatter(logging.Formatter):
    converter = staticmethod(time.gmtime)  # UTC, as the API server's timestamps

    def format(self, record: logging.LogRecord) -> str:
        # Milliseconds: a plan, its spec write and the releases it leads to are often within
        # one second of each other, and their order is what a latency question asks.
        stamp = f"{self.formatTime(record, '%Y-%m-%dT%H:%M:%S')}.{int(record.msecs):03d}Z"
        entry = {"time": stamp, "level": record.levelname,
                 "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # urllib3 says "Retrying ..." for each of a request's retries; what failed in the end is
    # what the caller logs, once.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
