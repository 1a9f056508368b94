"""Carry power changes to devices through the ledger, lowering before raising.

Every path that changes a device's limit (activate, reprovision, update, GPU
limits, deactivate, delete, raise-back, repair) hands `Applier.run` a list
of `Change`s. Each change has a ladder of acceptable levels, best first. In
a first round every change reserves its best level if it fits now (a
lowering always does) and is sent; what did not fit waits for the second
round, when the first round's lowerings are confirmed, and then takes the
best level that fits, or is refused. Answers settle in the ledger: a device
that confirmed counts its new watts, one that did not counts the higher of
old and new.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .execute import HostOutcome
from .ledger import Book
from .levels import Level
from .policy import PolicyElementType, PolicyLimit, PolicyObject, PowerLimit

ACTIVATE, UPDATE, DEACTIVATE = ("resource_group_activate", "resource_group_update",
                                "resource_group_deactivate")


@dataclass(frozen=True)
class Change:
    """Move one entity to the first level of ``ladder`` that fits the budget.

    ``kind`` is the device request (deactivate: back toward the topology
    policy, GPU limits reset); ``gpus`` are GPU limits to set with it.
    """

    entity: str
    group: Optional[str]
    kind: str
    ladder: Tuple[Level, ...]
    gpus: Optional[Mapping[str, float]] = None

    def to_json(self) -> Dict[str, Any]:
        return {"entity": self.entity, "group": self.group, "kind": self.kind,
                "ladder": [list(level) for level in self.ladder], "gpus": self.gpus}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "Change":
        return cls(doc["entity"], doc["group"], doc["kind"],
                   tuple((name, float(w)) for name, w in doc["ladder"]), doc.get("gpus"))


@dataclass
class Applied:
    """What a run did: per entity its answer and the level sent; notes on fallbacks."""

    outcomes: Dict[str, HostOutcome]
    levels: Dict[str, Level]
    notes: List[str]


#: sends [(change, level)] and returns entity -> HostOutcome (progress, cancellation)
Sender = Callable[[Sequence[Tuple[Change, Level]]], Dict[str, HostOutcome]]


class Applier:
    """Runs changes through the ledger and a sender, inside the store's transactions."""

    def __init__(self, topo, store, sender: Sender, patience: float = 0.0):
        self.topo = topo
        self.store = store
        self.sender = sender
        self.patience = patience    # seconds to wait for another process's request in flight

    def run(self, changes: Sequence[Change], two_rounds: bool = True,
            quiet: bool = False) -> Applied:
        """Reserve, send and settle ``changes``; see the module docstring."""
        done = Applied({}, {}, [])
        waiting = list(changes)
        for fallback in ((False, True) if two_rounds else (True,)):
            if not waiting:
                break
            chosen, waiting, refused = self._reserve_patiently(waiting,
                                                               fallback or not two_rounds)
            if fallback or not two_rounds:
                if not quiet:
                    done.outcomes.update(refused)
                    self._refused(changes, refused)
                waiting = []
            self._notes(chosen, done.notes)
            outcomes = self.sender(chosen) if chosen else {}
            with self.store.transaction():
                self._settle(chosen, outcomes)
            done.outcomes.update(outcomes)
            done.levels.update({c.entity: level for c, level in chosen})
        return done

    def _reserve_patiently(self, changes: Sequence[Change], fallback: bool):
        """`_reserve`, again for entities busy with another process's request, a while."""
        deadline = time.monotonic() + self.patience
        chosen: List[Tuple[Change, Level]] = []
        refused: Dict[str, HostOutcome] = {}
        while True:
            with self.store.transaction():
                got, waiting, left = self._reserve(changes, fallback)
            chosen += got
            refused.update(left)
            busy = [c for c in changes if c.entity in left
                    and left[c.entity].diag_msg.startswith("busy")]
            if not busy or time.monotonic() >= deadline:
                return chosen, waiting, refused
            changes = busy
            time.sleep(0.05)

    def _reserve(self, changes: Sequence[Change], fallback: bool):
        book = Book(self.topo, self.store)
        chosen: List[Tuple[Change, Level]] = []
        waiting: List[Change] = []
        refused: Dict[str, HostOutcome] = {}
        for change in changes:
            first_problem = ""
            for level in (change.ladder if fallback else change.ladder[:1]):
                problem = book.reserve(change.entity, level[1])
                if not problem:
                    chosen.append((change, level))
                    break
                first_problem = first_problem or problem
            else:
                if fallback:
                    refused[change.entity] = HostOutcome(False, first_problem)
                else:
                    waiting.append(change)
        book.flush()
        return chosen, waiting, refused

    def _settle(self, chosen: Sequence[Tuple[Change, Level]],
                outcomes: Mapping[str, HostOutcome]) -> None:
        book = Book(self.topo, self.store)
        members: Dict[Tuple[str, str], Any] = {}
        for group in {c.group for c, _l in chosen if c.group and c.kind != DEACTIVATE}:
            members.update({(group, m.entity): m for m in self.store.members(group)})
        rows = []
        for change, (name, watts) in chosen:
            result = outcomes.get(change.entity) or HostOutcome(False, "no answer")
            if result.ok:
                book.confirm(change.entity, watts, name)
            else:
                book.unanswered(change.entity)
            member = members.get((change.group, change.entity))
            if member is None:
                continue
            if result.ok:
                gpus = None if change.gpus is None else json.dumps(change.gpus, sort_keys=True)
                rows.append(member.__class__(member.entity, member.group_name, member.policy,
                                             name, watts, "active", "", gpus))
            else:
                state = "failed" if change.kind == ACTIVATE else member.state
                rows.append(member.__class__(member.entity, member.group_name, member.policy,
                                             member.applied_policy,
                                             book.counted(change.entity), state,
                                             result.diag_msg, member.gpu_policies))
        book.flush()
        self.store.put_members(rows)

    def _refused(self, changes: Sequence[Change], refused: Mapping[str, HostOutcome]) -> None:
        """Hosts an activation could not fit: failed, with the reason."""
        rows = []
        with self.store.transaction():
            for change in changes:
                if change.entity in refused and change.kind == ACTIVATE and change.group:
                    for m in self.store.members(change.group):
                        if m.entity == change.entity:
                            rows.append(m.__class__(m.entity, m.group_name, m.policy, None, None,
                                                    "failed", refused[m.entity].diag_msg))
            self.store.put_members(rows)

    def _notes(self, chosen: Sequence[Tuple[Change, Level]], notes: List[str]) -> None:
        """``g runs Med on 1, Low on 2 host(s) below its plan``: levels below the best."""
        lower: Dict[str, Dict[str, int]] = {}
        for change, level in chosen:
            if level != change.ladder[0]:
                counts = lower.setdefault(change.group or change.entity, {})
                counts[level[0] or "uncapped"] = counts.get(level[0] or "uncapped", 0) + 1
        for who, counts in sorted(lower.items()):
            notes.append("%s runs %s host(s) below its plan: the budget had no more room "
                         "when they were set" % (who, ", ".join(
                             "%s on %d" % kv for kv in sorted(counts.items()))))


def payload(topo, change: Change, level: Level) -> Dict[str, Any]:
    """The device request payload that puts ``change.entity`` at ``level``."""
    sent = node_policy(topo, change.entity, level)
    doc = None if sent is None else sent.to_dict()
    if change.kind == DEACTIVATE:
        return {"resource_group": change.group,
                "policy": {"policy_action": "unset", "policy": doc},
                "gpu_policies": {"gpu_policy_action": "reset", "gpu_policies": [],
                                 "current_policy": doc}}
    gpus = None
    if change.gpus is not None:
        gpus = {"gpu_policy_action": "set", "current_policy": doc,
                "gpu_policies": [{"gpu_id": int(g), "power_limit": {"watts": w}}
                                 for g, w in sorted(change.gpus.items(), key=lambda kv:
                                                    int(kv[0]))]}
    return {"resource_group": change.group,
            "policy": {"policy_action": "set" if doc is not None else "unset", "policy": doc},
            "gpu_policies": gpus}


def node_policy(topo, entity: str, level: Level) -> Optional[PolicyObject]:
    """The policy to send for ``level``: the named one, with its NODE limit raised when
    GPU limits need more watts than it gives."""
    name, watts = level
    policy = topo.policies.get(name) if name is not None else None
    if policy is None or topo.node_watts(entity, policy) >= watts - 1e-6:
        return policy
    others = tuple(lim for lim in policy.limits if lim.element_type is not PolicyElementType.NODE)
    return PolicyObject(policy.name, (PolicyLimit(PolicyElementType.NODE,
                                                  PowerLimit(watts=watts)),) + others,
                        policy.properties)


__all__ = ["Change", "Applied", "Applier", "payload", "node_policy", "ACTIVATE", "UPDATE",
           "DEACTIVATE"]
