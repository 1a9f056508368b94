"""Remember hook configs that already passed the schema check.

A Slurm prolog is a fresh process on every job start and holds the job
while it runs; importing jsonschema and running the validator is about half
of its time. Configs change rarely, so the state dir keeps the digests of
the last few config files that validated (with this version's schema), and
loading one of those again skips the jsonschema pass. Our own checks (value
ranges, hostlists, backends) still run every time.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, List, Optional

from pbs_power import __version__

#: File in the state dir holding one digest per line, newest last.
MEMO_NAME = "checked-configs"
#: Digests kept (older configs are validated again if they come back).
KEEP = 16


class ConfigMemo:
    """The checked-config digests in one state dir. Best effort: a memo that
    cannot be read or written is simply not used."""

    def __init__(self, path: str):
        self.path = path

    @classmethod
    def for_document(cls, data: Any, default_dir: str) -> Optional["ConfigMemo"]:
        """The memo of the state dir ``data`` names (else ``default_dir``), if it exists."""
        state_dir = data.get("state_dir") if isinstance(data, dict) else None
        if not isinstance(state_dir, str) or not os.path.isabs(state_dir):
            state_dir = default_dir
        if not os.path.isdir(state_dir):
            return None
        return cls(os.path.join(state_dir, MEMO_NAME))

    def holds(self, raw: bytes, schema: Any) -> bool:
        """Whether these config bytes passed the schema check before."""
        return digest(raw, schema) in self._read()

    def add(self, raw: bytes, schema: Any) -> None:
        """Record that these config bytes passed the schema check."""
        key = digest(raw, schema)
        keys = [k for k in self._read() if k != key][-(KEEP - 1):] + [key]
        tmp = "%s.%d.tmp" % (self.path, os.getpid())
        try:
            with open(tmp, "w") as f:
                f.write("".join(k + "\n" for k in keys))
            os.replace(tmp, self.path)    # atomic: concurrent readers see old or new
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def _read(self) -> List[str]:
        try:
            with open(self.path) as f:
                return [line.strip() for line in f if len(line.strip()) == 64]
        except (OSError, UnicodeDecodeError):
            return []


def digest(raw: bytes, schema: Any) -> str:
    """SHA-256 over the package version, the schema and the config bytes."""
    h = hashlib.sha256(__version__.encode() + b"\0")
    h.update(json.dumps(schema, sort_keys=True).encode() + b"\0")
    h.update(raw)
    return h.hexdigest()
