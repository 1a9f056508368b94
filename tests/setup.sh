#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian machine, then
# leave a virtual environment in .venv with pbs-power and its test extras.
# Run as root (CI does) so that system packages can be installed.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
python3 -c 'import ensurepip, venv' 2>/dev/null || need_apt+=(python3-venv)
if [ "${#need_apt[@]}" -gt 0 ]; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_apt[@]}"
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q -e '.[test]'
echo "tests/setup.sh: ready (.venv/bin/python -m pytest)"
