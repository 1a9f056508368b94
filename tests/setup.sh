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
if [ "${#need_apt[@]}" -gt 0 ]; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_apt[@]}"
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q -e '.[test]'
echo "tests/setup.sh: ready (.venv/bin/python -m pytest)"
