#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian machine, then
# leave a virtual environment in .venv with pbs-power and its test extras.
# Run as root (CI does) so that system packages can be installed.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
python3 -c 'import ensurepip, venv' 2>/dev/null || need_apt+=(python3-venv)
# IPMI tests: real BMC simulators (ipmi_sim), ipmitool, and what builds the
# simulators' DCMI extension (tests/emulators/ipmi_sim_dcmi.c).
command -v ipmi_sim >/dev/null || need_apt+=(openipmi)
command -v ipmitool >/dev/null || need_apt+=(ipmitool)
command -v gcc >/dev/null || need_apt+=(gcc libc6-dev)
[ -f /usr/include/OpenIPMI/mcserv.h ] || need_apt+=(libopenipmi-dev)
# SPANK plugin (slurm_spank/power_policy.c) is built against <slurm/spank.h>.
[ -f /usr/include/slurm/spank.h ] || need_apt+=(libslurm-dev)
# Slurm tests: a real Slurm cluster on localhost (tests/slurm_cluster.py).
for p in slurmctld slurmd slurm-client munge; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need_apt+=("$p")
done
# Observability tests: a real Prometheus scrapes the exporter; promtool checks
# the dashboard's queries. The tests start their own prometheus on a free port.
{ command -v prometheus && command -v promtool; } >/dev/null || need_apt+=(prometheus)
if [ "${#need_apt[@]}" -gt 0 ]; then
    apt-get -o DPkg::Lock::Timeout=600 update -q
    # keep package scripts from starting system-wide daemons (munged, slurmctld,
    # slurmd, prometheus)
    made_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        made_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q "${need_apt[@]}"
    if [ "$made_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
fi

# Slurm 24.11 in a Debian 13 chroot: the real-Slurm tests run on it as well.
bash tests/slurm_chroot.sh

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q -e '.[test]'
echo "tests/setup.sh: ready (.venv/bin/python -m pytest)"
