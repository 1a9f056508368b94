"""Request options and answers of the resource-group service, as plain data."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Mapping, Optional

from .policy import PolicyObject
from .execute import HostOutcome


# -- request options and answers ---------------------------------------------
@dataclass(frozen=True)
class AsyncStrategy:
    """Return once n hosts / a fraction of hosts are done, or after a wait."""

    n_hosts: Optional[int] = None
    frac_hosts: Optional[float] = None
    wait_seconds: Optional[float] = None


@dataclass(frozen=True)
class PartialActivation:
    """Accept activation when at least this many hosts succeed."""

    atleast_n_hosts: Optional[int] = None
    atleast_frac_hosts: Optional[float] = None
    host_activation_timeout: Optional[float] = None


@dataclass
class Status:
    """ok + diag_msg; ``code`` tells a CLI whether the input or the operation failed."""

    ok: bool = True
    diag_msg: str = ""
    code: str = "ok"            # ok | failed | invalid | not_found | busy

    def __post_init__(self) -> None:
        if not self.ok and self.code == "ok":
            self.code = "failed"


@dataclass
class Response:
    """Answer to an operation: status, per-node results, async operation id."""

    status: Status = field(default_factory=Status)
    node_statuses: Dict[str, HostOutcome] = field(default_factory=dict)
    operation_id: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return {"status": asdict(self.status), "operation_id": self.operation_id,
                "node_statuses": {k: v.to_dict() for k, v in self.node_statuses.items()}}


def fail(msg: str, code: str = "failed") -> Response:
    return Response(Status(False, msg, code))


def policy_dict(policy: Optional[PolicyObject]) -> Optional[Dict[str, Any]]:
    return None if policy is None else policy.to_dict()


def outcomes_of(responses: Mapping[str, Any]) -> Dict[str, HostOutcome]:
    return {d: HostOutcome(r.success, r.error, (r.policy or {}).get("name") if r.success else None,
                           r.power_cap_watts) for d, r in responses.items()}


def failures(outcomes: Mapping[str, HostOutcome]) -> str:
    bad = sorted((e, o.diag_msg) for e, o in outcomes.items() if not o.ok)
    shown = ", ".join("%s: %s" % item for item in bad[:5])
    return shown + (" and %d more" % (len(bad) - 5) if len(bad) > 5 else "")


