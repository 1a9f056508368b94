"""Copies of frozen records, shared by every package (kept apart so that using it
imports no model)."""
from __future__ import annotations

from typing import Any


def evolve(obj: Any, **changes: Any) -> Any:
    """A copy of a frozen dataclass instance with ``changes`` applied.

    Like `dataclasses.replace` but without re-running ``__init__``: hot
    paths copy thousands of records per fan-out. Only for plain frozen
    dataclasses (no __slots__, no __post_init__ checks to re-run).
    """
    new = object.__new__(obj.__class__)
    new.__dict__.update(obj.__dict__)
    new.__dict__.update(changes)
    return new
