"""Reading a JSON config file: its bytes (a FIFO never hangs the reader), UTF-8, duplicate keys."""
from __future__ import annotations

import json
import os
import stat
from typing import Any, Dict, List, Tuple

from .checks import ConfigError


def read_bytes(source: str) -> bytes:
    """The file's bytes. A FIFO is opened without waiting for a writer, so one that nothing
    writes to reads as empty instead of hanging the hook (or the validator) for ever."""
    fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.set_blocking(fd, True)   # a writer already there: read until it closes
        with os.fdopen(fd, "rb") as f:
            fd = -1
            return f.read()
    finally:
        if fd >= 0:
            os.close(fd)


def read_json(source: str, duplicates: List[str]) -> Tuple[bytes, Any]:
    """The bytes of ``source`` and its JSON document; duplicate keys are noted
    (PBS accepts them)."""
    try:
        raw = read_bytes(source)
    except FileNotFoundError:
        raise ConfigError("file not found", source) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, not a config file", source) from None
    except OSError as exc:
        raise ConfigError("cannot read the file: %s" % (exc.strerror or exc), source) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError("not UTF-8 text (bad byte at offset %d)" % exc.start, source) from None
    if not text.strip():
        raise ConfigError("the file is empty: write a JSON object, e.g. {}", source)

    def pairs(items: List[Tuple[str, Any]]) -> Dict[str, Any]:
        seen: Dict[str, Any] = {}
        for key, value in items:
            if key in seen:
                duplicates.append("duplicate key %r: JSON keeps only its last value" % key)
            seen[key] = value
        return seen

    try:
        return raw, json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise ConfigError("invalid JSON at line %d, column %d: %s"
                          % (exc.lineno, exc.colno, exc.msg), source) from None
    except RecursionError:
        raise ConfigError("invalid JSON: nested too deeply", source) from None
