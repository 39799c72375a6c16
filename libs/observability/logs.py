"""Logs: one JSON object per line, always naming the service; a short text line on a terminal.

Anything passed with `extra=` lands in the line; `extra={"fields": {...}}` is flattened so call
sites can pass a whole dict of facts at once. `PRIME_LOG_FORMAT=json|text` picks the format;
unset, a terminal gets text (`12:00:01 INFO  worker: submitted version=3`) and anything else
(a file, a container's log driver) gets JSON. Every logger, uvicorn's included, goes through
the one handler on the root logger.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Annotated, Literal, TextIO

from pydantic import BeforeValidator

LOG_FORMAT_ENV = "PRIME_LOG_FORMAT"

# The type of every service's `log_level` setting: a bad name is a settings error, not a crash.
LogLevel = Annotated[
    Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
    BeforeValidator(lambda v: v.upper() if isinstance(v, str) else v),
]

# Attributes every LogRecord has; anything else was passed via `extra=` and is worth keeping.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "color_message",  # uvicorn duplicates msg with ANSI colours
    "taskName",
}


def _extras(record: logging.LogRecord, taken: dict[str, object]) -> dict[str, object]:
    """What the call site passed with `extra=`, `fields` flattened."""
    out: dict[str, object] = {}
    for key, value in vars(record).items():
        if key == "fields" and isinstance(value, dict):
            out.update({k: v for k, v in value.items() if k not in taken and k not in out})
        elif key not in _STANDARD and key not in taken and key not in out:
            out[key] = value
    return out


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str, **static: object) -> None:
        super().__init__()
        self.service = service
        self.static = static

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "service": self.service,
            **self.static,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(_extras(record, out))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """`HH:MM:SS LEVEL service: message key=value ...`, local time, for a person at a terminal."""

    _COLOURS = {"WARNING": "\033[33m", "ERROR": "\033[31m", "CRITICAL": "\033[31;1m"}

    def __init__(self, service: str, colour: bool = False) -> None:
        super().__init__()
        self.service = service
        self.colour = colour

    def format(self, record: logging.LogRecord) -> str:
        level = f"{record.levelname:<5}"
        if self.colour and record.levelname in self._COLOURS:
            level = f"{self._COLOURS[record.levelname]}{level}\033[0m"
        facts = "".join(f" {k}={v}" for k, v in _extras(record, {"service": self.service}).items())
        when = time.strftime("%H:%M:%S", time.localtime(record.created))
        line = f"{when} {level} {self.service}: {record.getMessage()}{facts}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def log_format(stream: TextIO) -> str:
    """`json` or `text`: PRIME_LOG_FORMAT if set, else text on a terminal and JSON otherwise."""
    chosen = os.environ.get(LOG_FORMAT_ENV, "").strip().lower()
    if chosen in ("json", "text"):
        return chosen
    return "text" if stream.isatty() else "json"


def setup_logging(service: str, level: str = "INFO", **static: object) -> logging.Logger:
    handler = logging.StreamHandler(sys.stderr)
    if log_format(sys.stderr) == "text":
        colour = sys.stderr.isatty() and not os.environ.get("NO_COLOR")
        handler.setFormatter(TextFormatter(service, colour=colour))
    else:
        handler.setFormatter(JsonFormatter(service, **static))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn's own loggers (run with log_config=None) carry no handler: they reach this one.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    # Per-request lines (every heartbeat, every shard) are noise, not information.
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return logging.getLogger(service)
