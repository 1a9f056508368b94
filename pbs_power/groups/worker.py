"""The detached worker that finishes an asynchronous resource-group operation.

Started by `pbs_power.groups.execute.spawn_worker` as
``python -m pbs_power.groups.worker STATE_DIR OPERATION_ID``; it outlives the prolog
that asked for asynchronous activation.
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from .service import ResourceGroupService


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Worker entry point: ``python -m pbs_power.groups.worker STATE_DIR OP_ID``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m pbs_power.groups.worker STATE_DIR OPERATION_ID", file=sys.stderr)
        return 2
    service = ResourceGroupService.from_operation(args[0], args[1])
    try:
        service.finish_operation(args[1])
    finally:
        service.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
