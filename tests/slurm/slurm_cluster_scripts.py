"""Scripts the test Slurm cluster (tests/slurm/slurm_cluster.py) writes into DIR/bin.

Bash, because slurmctld runs the power programs and wrappers exactly as it
would run a site's: fds 0-2 closed, an environment of only SLURM_CONF and a
blocked signal mask. A node "boots" when its ``slurmd -b -N NODE`` starts.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

HOOK_ENV = """\
# sourced by the scripts in this directory
SLURM_TEST_DIR={dir}
HOOK_LOG_DIR={dir}/log/hooks
export SLURM_TEST_DIR
export SLURM_CONF=${{SLURM_CONF:-{dir}/etc/slurm.conf}}
# run a command with an empty signal mask (perl-base is Essential on Debian)
unblock() {{ perl -MPOSIX -e 'sigprocmask(SIG_SETMASK, POSIX::SigSet->new); exec {{$ARGV[0]}} @ARGV or die "exec $ARGV[0]: $!\\n"' "$@"; }}
alive() {{ [ -n "${{1:-}}" ] && kill -0 "$1" 2>/dev/null && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }}
"""

# slurmctld ignores a registration whose boot time (whole seconds) is before the
# resume request's whole wall-clock second, and slurmd must be started with -b
# ("booted now"), else the node fails at ResumeTimeout: start in the next second.
NODE_POWER_ON = """\
#!/bin/bash
# node-power-on HOSTLIST: "boot" emulated nodes = start `slurmd -b -N <node>` for each
. "$(dirname "$0")/hook-env"
export PATH=%(path)s
sleep "$(awk -v n="$(date +%%N)" 'BEGIN{printf "%%.3f", (1e9 - n) / 1e9 + 0.02}')"
rc=0
for h in $(scontrol show hostnames "$1"); do
  if [ -e "$SLURM_TEST_DIR/run/never-boots-$h" ]; then   # SlurmCluster.never_boots(h)
    echo "$(date +%%T.%%N) $h powered on, but its OS never comes up"; continue
  fi
  pidf="$SLURM_TEST_DIR/run/slurmd-$h.pid"
  for i in $(seq 1 150); do [ -e "$pidf.stopping" ] || break; sleep 0.1; done
  if [ -f "$pidf" ] && alive "$(cat "$pidf")"; then
    echo "$(date +%%T.%%N) $h already running (pid $(cat "$pidf"))"; continue
  fi
  rm -f "$pidf"
  unblock slurmd -b -N "$h" </dev/null >>"$SLURM_TEST_DIR/log/slurmd-start.log" 2>&1 || rc=1
  for i in $(seq 1 50); do [ -s "$pidf" ] && break; sleep 0.1; done
  echo "$(date +%%T.%%N) started slurmd for $h (pid $(cat "$pidf" 2>/dev/null))"
done
exit $rc
""" % {"path": SAFE_PATH}

NODE_POWER_OFF = """\
#!/bin/bash
# node-power-off HOSTLIST: "shut down" emulated nodes = stop their slurmd (TERM, wait, KILL)
. "$(dirname "$0")/hook-env"
export PATH=%(path)s
declare -A pids
for h in $(scontrol show hostnames "$1"); do
  pidf="$SLURM_TEST_DIR/run/slurmd-$h.pid"
  [ -f "$pidf" ] || { echo "$(date +%%T.%%N) $h: no slurmd"; continue; }
  touch "$pidf.stopping"
  pids[$h]=$(cat "$pidf"); kill -TERM "${pids[$h]}" 2>/dev/null || true
done
for h in "${!pids[@]}"; do
  pid=${pids[$h]}; pidf="$SLURM_TEST_DIR/run/slurmd-$h.pid"
  for i in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
  alive "$pid" && { kill -KILL "$pid" 2>/dev/null; echo "$(date +%%T.%%N) $h: SIGKILL $pid"; }
  rm -f "$pidf" "$pidf.stopping"
  echo "$(date +%%T.%%N) stopped slurmd for $h (pid $pid)"
done
""" % {"path": SAFE_PATH}

# The `command` power backend's protocol (pbs_power/devices/command.py):
# `node-power-site OPERATION HOST`, JSON request on stdin, JSON answer on stdout.
NODE_POWER_SITE = """\
#!/bin/bash
# node-power-site OPERATION HOST: the emulated nodes' power, as a `command` backend site script
. "$(dirname "$0")/hook-env"
export PATH=%(path)s
op=$1; host=$2
cat >/dev/null
log="$SLURM_TEST_DIR/log/hooks/node-power-site.log"
echo "$(date +%%T.%%N) $op $host" >>"$log"
case "$op" in
  power_on|wake)
    "$(dirname "$0")/node-power-on" "$host" >>"$log" 2>&1 && echo '{"success": true}' \\
      || echo '{"success": false, "error": "slurmd did not start"}' ;;
  power_off|sleep)
    "$(dirname "$0")/node-power-off" "$host" >>"$log" 2>&1; echo '{"success": true}' ;;
  status)
    pidf="$SLURM_TEST_DIR/run/slurmd-$host.pid"
    if [ -f "$pidf" ] && alive "$(cat "$pidf")" && [ ! -e "$pidf.stopping" ]; then st=on; else st=off; fi
    echo "{\\"success\\": true, \\"power_state\\": \\"$st\\", \\"since\\": null}" ;;
  *) echo "{\\"success\\": false, \\"error\\": \\"unknown operation $op\\"}" ;;
esac
""" % {"path": SAFE_PATH}

LOG_HOOK = """\
# sourced by the wrappers: append "=== time name argv", uid, signal mask and the original env
{ echo "=== $(date +%T.%N) $HOOK_NAME argv: $*"
  echo "uid=$(id -u) pid=$$ ppid=$PPID cwd=$(pwd) $(grep SigBlk /proc/$$/status | tr -d '\\t')"
  echo "$HOOK_ORIG_ENV"
} >> "$HOOK_LOG_DIR/$HOOK_NAME.log" 2>&1
"""


def wrapper_script(directory: Path, name: str, program: Optional[str],
             env: Mapping[str, str]) -> str:
    """A wrapper that logs what slurmctld gave it, then runs ``program`` unchanged."""
    lines = ["#!/bin/bash", "HOOK_NAME=%s; HOOK_ORIG_ENV=$(env | sort)" % name,
             '. "%s/bin/hook-env"' % directory, '. "%s/bin/log-hook"' % directory]
    lines += ["export %s=%s" % (k, _quote(v)) for k, v in env.items()]
    if program:
        # the program gets SLURM_CONF only if slurmctld gave it one (hook-env sets it
        # for the test's own scripts): PrologSlurmctld, for one, gets none
        lines.append('case "$HOOK_ORIG_ENV" in *SLURM_CONF=*) ;; *) unset SLURM_CONF ;; esac')
        lines.append('exec %s "$@"' % _quote(program))
    elif name in ("suspend", "resume"):
        lines.append('exec </dev/null >>"%s/log/hooks/%s.out" 2>&1   # fds 0-2 arrive closed'
                     % (directory, name))
        target = "node-power-off" if name == "suspend" else "node-power-on"
        lines.append('exec "%s/bin/%s" "$1"' % (directory, target))
    else:
        lines.append('rc=$(cat "%s/control/%s.rc" 2>/dev/null || echo 0)' % (directory, name))
        lines.append('exit "$rc"')
    return "\n".join(lines) + "\n"


def _quote(value: str) -> str:
    return "'" + str(value).replace("'", "'\\''") + "'"
