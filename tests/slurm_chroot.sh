#!/usr/bin/env bash
# Build a Debian 13 (trixie) chroot holding Slurm 24.11, so that the real-Slurm
# tests run against it beside the host's Slurm (tests/slurm/slurm_installs.py
# runs a cluster's daemons and commands inside). Run as root; tests/setup.sh
# calls it.
#
#   tests/slurm_chroot.sh [ROOT]     ROOT defaults to $PBS_POWER_SLURM_CHROOT or
#                                    /var/lib/pbs-power-tests/slurm-trixie
#
# Packages come from the Debian mirror this machine's apt already uses. The
# chroot gets its own /etc/hosts (Slurm's name lookups hang without one), a
# policy-rc.d (no daemon starts at install), and a venv at /opt/pbs-power whose
# pbs-power is this checkout, editable, bind-mounted at /opt/pbs-power/src
# (the tests mount whichever checkout runs them there). The script runs in a
# mount namespace of its own: proc, sys, dev and the checkout are mounted
# there and gone when it exits. A second run installs only what the package
# list gained and refreshes the editable install (a stamp records the build).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd -P)
if [ -z "${SLURM_CHROOT_NS:-}" ]; then
    SLURM_CHROOT_NS=1 exec unshare --mount --propagation private -- bash "$0" "$@"
fi
SRC=/opt/pbs-power/src
ROOT=${1:-${PBS_POWER_SLURM_CHROOT:-/var/lib/pbs-power-tests/slurm-trixie}}
SUITE=trixie
# What the chroot holds: Slurm and munge, the headers the SPANK plugin builds
# against, and Python with the package's dependencies from Debian.
PACKAGES=(slurmctld slurmd slurm-client munge libslurm-dev gcc libc6-dev
          python3 python3-venv python3-pip python3-setuptools python3-wheel
          python3-jsonschema python3-requests python3-clustershell python3-websockets
          make procps iproute2)
STAMP="$ROOT/etc/pbs-power-chroot"
LOG="$ROOT.setup.log"

[ "$(id -u)" = 0 ] || { echo "slurm_chroot.sh: run as root" >&2; exit 1; }

# The mirror apt uses for Debian's main archive (deb822 sources or sources.list).
debian_mirror() {
    local f uri
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        uri=$(awk '/^URIs:/ {u=$2} /^Suites:/ && u != "" && $0 !~ /security/ {print u; exit}
                   /^$/ {u=""}' "$f")
        [ -n "$uri" ] && { echo "$uri"; return; }
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        uri=$(awk '$1 == "deb" && $0 !~ /security/ && $0 ~ / main/ {
                     for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' "$f")
        [ -n "$uri" ] && { echo "$uri"; return; }
    done
    return 1
}

# Every mount point at or below ROOT, deepest first.
mounts_below() {
    awk -v r="$ROOT" '$2 == r || index($2, r "/") == 1 {print $2}' /proc/self/mounts | sort -r
}

unmount_all() {
    local m
    for m in $(mounts_below); do
        umount "$m" 2>/dev/null || umount -l "$m"
    done
}

mount_system() {
    mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
    mountpoint -q "$ROOT/sys" || mount -t sysfs sysfs "$ROOT/sys"
    if ! mountpoint -q "$ROOT/dev"; then
        mount --rbind /dev "$ROOT/dev"
        mount --make-rslave "$ROOT/dev"
    fi
}

in_root() {
    env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive chroot "$ROOT" "$@"
}

install_packages() {
    mount_system
    in_root apt-get update -q >>"$LOG" 2>&1
    in_root apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >>"$LOG" 2>&1 || {
        tail -20 "$LOG" >&2; exit 1; }
    in_root apt-get clean
}

build() {
    local mirror
    mirror=$(debian_mirror) || { echo "slurm_chroot.sh: no Debian mirror in apt's sources" >&2; exit 1; }
    command -v debootstrap >/dev/null || {
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap
    }
    if [ -n "$(mounts_below)" ]; then
        echo "slurm_chroot.sh: $ROOT has mounts; not rebuilding over them" >&2; exit 1
    fi
    rm -rf --one-file-system "$ROOT"
    mkdir -p "$ROOT"
    echo "slurm_chroot.sh: debootstrap $SUITE from $mirror into $ROOT"
    debootstrap --variant=minbase --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
        "$SUITE" "$ROOT" "$mirror" >"$LOG" 2>&1 || { tail -20 "$LOG" >&2; exit 1; }
    # the host's apt settings (e.g. a snapshot mirror's validity checks) apply inside too
    cp /etc/apt/apt.conf.d/* "$ROOT/etc/apt/apt.conf.d/" 2>/dev/null || true
    printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
    chmod 755 "$ROOT/usr/sbin/policy-rc.d"
    printf '127.0.0.1\tlocalhost %s\n::1\tlocalhost ip6-localhost\n' "$(hostname)" >"$ROOT/etc/hosts"
    install_packages
    in_root python3 -m venv --system-site-packages /opt/pbs-power
}

trap unmount_all EXIT
start=$(date +%s)
if [ ! -f "$STAMP" ]; then
    build
elif [ "$(sed -n 's/^packages=//p' "$STAMP")" != "${PACKAGES[*]}" ]; then
    install_packages
fi
# This checkout, editable, into the chroot's venv.
mkdir -p "$ROOT$SRC"
mount --bind "$REPO" "$ROOT$SRC"
in_root /opt/pbs-power/bin/pip install -q --no-deps --no-build-isolation --no-index -e "$SRC" \
    >>"$LOG" 2>&1 || { tail -20 "$LOG" >&2; exit 1; }
version=$(in_root /usr/sbin/slurmctld -V | awk '{print $2}')
printf 'suite=%s\nslurm=%s\npackages=%s\n' "$SUITE" "$version" "${PACKAGES[*]}" >"$STAMP"
echo "slurm_chroot.sh: Slurm $version ready in $ROOT ($(( $(date +%s) - start )) s)"
