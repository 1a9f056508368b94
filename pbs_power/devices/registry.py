"""Building the power backend a config names (the type -> module table is in
`pbs_power.config.backends`)."""
from __future__ import annotations

import importlib

from pbs_power.config.backends import BACKENDS
from pbs_power.config.hook_config import BackendConfig
from .base import BackendError, PowerBackend


def get_backend(config: BackendConfig, state_dir: str) -> PowerBackend:
    """Build the backend named by ``config.type`` with ``config.options``."""
    entry = BACKENDS.get(config.type) if isinstance(config.type, str) else None
    if entry is None:
        raise BackendError(f"power backend '{config.type}' is not available "
                           f"in this version (available: "
                           f"{', '.join(sorted(BACKENDS))})")
    module = importlib.import_module(entry[0])
    return getattr(module, entry[1])(config.options, state_dir)
