"""Lazy public names for the subpackages' ``__init__``: a name is imported on first use.

A hook or a Slurm prolog runs once per event, so a package's ``__init__`` must
not import every module of the package; ``exports`` gives it PEP 562's
``__getattr__`` over a name -> module table instead.
"""
from __future__ import annotations

import importlib

TYPE_CHECKING = False  # every package __init__ loads this: no typing import at run time
if TYPE_CHECKING:
    from typing import Callable


def exports(package: str, table: dict[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` that imports ``table[name]`` (relative to ``package``) on use."""
    def __getattr__(name: str) -> object:
        module = table.get(name)
        if module is None:
            raise AttributeError("module %r has no attribute %r" % (package, name))
        return getattr(importlib.import_module(module, package), name)
    return __getattr__


def names(table: dict[str, str]) -> list[str]:
    """``__all__`` for a lazy table."""
    return sorted(table)
