"""Refusing an unknown or malformed ``power_policy`` when a job is submitted or altered.

Runs in the ``queuejob`` and ``modifyjob`` events (inside pbs_server): a
rejection there makes ``qsub``/``qalter`` print ``qsub: <message>`` and
exit non-zero, and no job is created (seen on OpenPBS 23.06). Without this
an unknown policy would be refused at every scheduling cycle instead.
Known policies are the active topology's; with no active topology only the
form is checked (job policies are off then anyway).
"""
from __future__ import annotations

import re
from typing import Iterable, Optional

from .log import LogFn

#: What a policy name may look like in a job's resources: no blank, comma, colon,
#: plus or equals sign (they would split PBS's resource syntax), printable.
_NAME = re.compile(r"^[^\s,:+=\"']{1,128}$")


def policy_refusal(requested: Optional[str], known: Optional[Iterable[str]]) -> Optional[str]:
    """Why ``requested`` cannot be asked for, or None; ``known`` None: form only."""
    if requested is None:
        return None
    if not _NAME.match(requested) or not requested.isprintable():
        return "power_policy %r is malformed (1-128 printable characters, no blank or , : + = quote)" \
            % requested
    if known is not None:
        names = sorted(known)
        if requested not in names:
            return "unknown power_policy %s; known: %s" % (requested, ", ".join(names) or "none")
    return None


def check_submission(pbs, config_file: Optional[str]):
    """The Outcome of a queuejob/modifyjob event: refuse a bad ``power_policy``."""
    from .jobs import Outcome, _resource, _setup
    job = pbs.event().job
    requested = _resource(job.Resource_List, "power_policy")
    if requested is None:
        return Outcome(True)
    config, log = _setup(pbs, config_file)
    known = None
    if config is not None:
        known = _known_policies(config, log)
    why = policy_refusal(requested, known)
    if why is None:
        return Outcome(True)
    log("info", "submission refused: %s" % why)
    return Outcome(False, "pbs_power: " + why)


def _known_policies(config, log: LogFn):
    from .jobs import open_service
    service = open_service(config, log, quiet=True)
    if service is None:
        return None
    try:
        topology, _active = service.topology()
        return set(topology.policies)
    finally:
        service.close()
