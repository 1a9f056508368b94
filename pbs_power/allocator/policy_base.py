"""What a resource allocation policy is: the seed's class interface.

A policy is any class with ``__init__(rule_id, settings, parameters)``,
``eval(parameters, input_data, context) -> dict`` and, optionally,
``management(action, data) -> dict``; `PolicyRule` is a convenient base.
``settings`` holds ``cluster_client`` and ``cluster_metrics_client`` (see
`pbs_power.allocator.clients`); ``input_data`` is ``{"cluster_data": {ID:
{"data": ..., "cluster_metrics": ...}}, "inputs": ...}`` (a private copy the
policy may change); ``context`` is a dict kept across runs of the same rule
(shared by concurrent runs: change it with single dict operations). A policy
that finds its inputs unusable raises `InputError`; the client then gets an
``invalid_inputs`` error with its message. A policy class that sets
``READS_INPUT_ONLY = True`` promises never to change ``input_data``: it then
gets the server's cached cluster data itself instead of a copy (faster on
large clusters; changing it would corrupt what other requests see).
"""
from __future__ import annotations

from typing import Any, Dict, Mapping


class InputError(ValueError):
    """The request's ``inputs`` (or ``parameters``) do not suit the policy."""


class PolicyRule:
    """Base of the shipped policies: stores what ``__init__`` gets, merges parameters."""

    #: Parameters used when neither the registry nor the request gives them.
    DEFAULT_PARAMETERS: Mapping[str, Any] = {}
    #: True: the policy never changes ``input_data`` (it gets the shared, uncopied data).
    READS_INPUT_ONLY = False

    def __init__(self, rule_id: str, settings: Dict[str, Any], parameters: Dict[str, Any]):
        self.rule_id = rule_id
        self.settings = settings
        self.parameters = parameters

    def eval(self, parameters: Dict[str, Any], input_data: Dict[str, Any],
             context: Dict[str, Any]) -> Dict[str, Any]:
        """Decide the allocations; subclasses implement it."""
        raise NotImplementedError

    def management(self, action: str, data: Dict[str, Any]) -> Dict[str, Any]:
        """Report the rule's parameters (``get_parameters``); nothing else is managed."""
        if action == "get_parameters":
            return {"status": "ok", "parameters": dict(self.parameters)}
        return {"status": "error", "message": "unknown action %r" % action}

    def merged(self, parameters: Mapping[str, Any]) -> Dict[str, Any]:
        """Class defaults, then the rule's parameters, then those of this run."""
        out = dict(self.DEFAULT_PARAMETERS)
        out.update(self.parameters or {})
        out.update(parameters or {})
        unknown = sorted(set(out) - set(self.DEFAULT_PARAMETERS))
        if unknown:
            raise InputError("unknown parameter(s) %s for policy %s (known: %s)"
                             % (", ".join(unknown), self.rule_id,
                                ", ".join(sorted(self.DEFAULT_PARAMETERS))))
        return out
