"""Run sushy-tools' Redfish emulator with a pinned power delay and OUR test extensions.

Usage: python sushy_launcher.py [--power-delay SECONDS] SUSHY-EMULATOR-ARGS...

sushy-tools' fake systems driver applies a power change a random 1-11 s after
it is asked (``random.randint(1, 11)`` in
``sushy_tools/emulator/resources/systems/fakedriver.py``, ``set_power_state``);
tests cannot wait that long, so this launcher replaces the driver module's
``random`` with one whose ``randint`` returns ``--power-delay`` (whole
seconds; the driver adds it to ``int(time.time())``, so 1 means "within a
second"). It then installs ``redfish_extensions`` (ours, not sushy-tools')
and starts the emulator's own ``main()`` with the remaining arguments. The
emulator exits by itself once the process that started it is gone, so a
killed test run leaves no emulator behind.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time


class PinnedRandom:
    """Stands in for the ``random`` module inside sushy's fake driver."""

    def __init__(self, delay: int) -> None:
        self.delay = delay

    def randint(self, low: int, high: int) -> int:
        return self.delay


def exit_with_parent() -> None:
    """Exit as soon as our parent process is gone (we are re-parented)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)
    threading.Thread(target=watch, daemon=True).start()


def main() -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--power-delay", type=int, default=1)
    ours, rest = parser.parse_known_args()
    exit_with_parent()

    from sushy_tools.emulator.resources.systems import fakedriver
    fakedriver.random = PinnedRandom(ours.power_delay)

    from sushy_tools.emulator import main as emulator
    sys.argv = ["sushy-emulator"] + rest
    args = emulator.parse_args()
    if args.config:  # our extensions read their settings from the same config file
        emulator.app.configure(config_file=args.config)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import redfish_extensions
    redfish_extensions.install(emulator.app)
    return emulator.main()


if __name__ == "__main__":
    sys.exit(main())
