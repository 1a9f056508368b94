"""The Slurm installations the real-cluster tests run against: the host's and a chroot's.

The host's Slurm is Debian 12's 22.05 (tests/setup.sh). Beside it,
tests/slurm_chroot.sh builds a Debian 13 chroot with Slurm 24.11 and a venv
whose pbs-power is the checkout mounted at /opt/pbs-power/src. A cluster on
the chroot runs every daemon and command inside it: each command starts in a
mount namespace of its own where proc, sys, dev, /tmp (the clusters' files,
at the same paths inside and out) and this checkout are mounted, then
chroots. The mounts live as long as the command (or the daemon it started)
and vanish with it; nothing is left mounted on the host.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
REPO = Path(__file__).resolve().parents[2]
#: Where tests/slurm_chroot.sh builds the chroot (override with PBS_POWER_SLURM_CHROOT).
CHROOT = Path(os.environ.get("PBS_POWER_SLURM_CHROOT", "/var/lib/pbs-power-tests/slurm-trixie"))
CHROOT_VENV = Path("/opt/pbs-power")
SLURM_BINARIES = ("slurmctld", "slurmd", "munged", "sinfo", "squeue", "sbatch", "scontrol")

# Run by /bin/sh in a fresh mount namespace: ROOT SRC CWD ARGV... (data, never code).
# The command gets the caller's environment as it was, PATH (or its absence) included.
_ENTER = """\
root=$1 src=$2 cwd=$3; shift 3
had_path=${PATH+1} caller_path=${PATH-}
PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc "$root/proc" && mount -t sysfs sysfs "$root/sys" &&
  mount --rbind /dev "$root/dev" && mount --bind /tmp "$root/tmp" &&
  mount --bind "$src" "$root/opt/pbs-power/src" || exit 125
if [ -n "$had_path" ]; then PATH=$caller_path; else unset PATH; fi
exec /usr/sbin/chroot "$root" /bin/sh -c 'cd "$1" 2>/dev/null || cd /; shift; exec "$@"' \\
  sh "$cwd" "$@"
"""


@dataclass(frozen=True)
class SlurmInstall:
    """One Slurm installation: where its commands run and where pbs-power's programs are."""

    name: str                       # ``host`` or ``chroot``
    root: Optional[Path] = None     # the chroot, None for the host
    #: pbs-power's console scripts, as the cluster's daemons see them.
    program_bin: Path = Path("/usr/bin")
    #: this checkout, as the cluster's commands see it.
    repo: Path = REPO

    def argv(self, argv: Sequence[str], cwd: Optional[str] = None) -> List[str]:
        """The argv that runs ``argv`` in this installation."""
        if self.root is None:
            return list(argv)
        return ["/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", _ENTER,
                "enter-slurm-chroot", str(self.root), str(REPO), cwd or os.getcwd()] + list(argv)

    def skip_reason(self) -> Optional[str]:
        """Why clusters of this installation cannot run here, or None when they can."""
        if os.geteuid() != 0:
            return "Slurm cluster tests need root (slurmd runs jobs as root); CI runs as root"
        if self.root is None:
            missing = [b for b in SLURM_BINARIES if shutil.which(b, path=SAFE_PATH) is None]
            if missing:
                return ("Slurm not installed (missing %s): run tests/setup.sh as root"
                        % ", ".join(missing))
            return None
        if not (self.root / "etc" / "pbs-power-chroot").is_file():
            return ("no Slurm chroot at %s: tests/setup.sh builds it (tests/slurm_chroot.sh)"
                    % self.root)
        if not os.access("/usr/bin/unshare", os.X_OK):
            return "unshare (util-linux) is missing"
        return None

    @property
    def version(self) -> str:
        """Slurm's release (``22.05``), '' when it cannot be told."""
        if self.root is not None:
            stamp = self.root / "etc" / "pbs-power-chroot"
            text = stamp.read_text() if stamp.is_file() else ""
            full = next((l.split("=", 1)[1] for l in text.splitlines()
                         if l.startswith("slurm=")), "")
        else:
            found = shutil.which("slurmctld", path=SAFE_PATH)
            if found is None:
                return ""
            out = subprocess.run([found, "-V"], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, universal_newlines=True,
                                 timeout=30, check=False).stdout.split()
            full = out[1] if len(out) > 1 else ""
        return ".".join(full.split(".")[:2])

    def version_at_least(self, major: int, minor: int) -> bool:
        """This Slurm is release ``major.minor`` or later."""
        try:
            have = tuple(int(p) for p in self.version.split("."))
        except ValueError:
            return False
        return have >= (major, minor)


HOST = SlurmInstall("host", None, Path(sys.executable).parent, REPO)
CHROOT_INSTALL = SlurmInstall("chroot", CHROOT, CHROOT_VENV / "bin", CHROOT_VENV / "src")


def installs() -> List[SlurmInstall]:
    """Every installation the real-cluster tests run against."""
    return [HOST, CHROOT_INSTALL]


def install_id(install: SlurmInstall) -> str:
    """``slurm22.05`` / ``slurm24.11``: the test id of an installation."""
    return "slurm" + (install.version or install.name)
