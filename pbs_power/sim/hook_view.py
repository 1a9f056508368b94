"""The simulated cluster as the PBS hook reads it, and the hook's own forecast of it.

The pbs-power manager must act on what the real hook would compute, not on
the simulator's knowledge: each node is a vnode with ``ncpus`` 1 (a job
takes whole nodes), each queued job a ``select`` of its width with its
requested walltime, each running job frees its nodes when its walltime
runs out (qstat's ``stime`` + ``Resource_List.walltime``), and nodes that
are marked asleep, down or coming up show as ``sleep``. The hook's
`forecast_starts` turns that into starts and vnodes; every vnode, release
and chunk here being one whole ncpus, it takes the path that counts
vnodes (`forecast_whole_vnodes`) without checking that each time.
"""
from __future__ import annotations

import heapq
from typing import Dict, FrozenSet, Iterable, List, Mapping, Optional, Tuple

from pbs_power.pbs.demand import typical_boot
from pbs_power.pbs.forecast import Release, forecast_whole_vnodes
from pbs_power.pbs.placement import Chunk, JobRequest, VnodeSpace
from .nodes import BOOTING, DOWN, IDLE, SHUTTING, Node

_ONE = (("ncpus", 1.0),)


class HookView:
    """Builds the hook's inputs from an engine, keeping what does not change."""

    def __init__(self, engine):
        self.engine = engine
        self._spaces: Dict[Tuple[int, bool], VnodeSpace] = {}
        self._requests: Dict[int, JobRequest] = {}
        self._releases: Dict[int, Release] = {}
        self._index = {n.name: n for n in engine.nodes}
        self._last: Optional[tuple] = None

    def forecast(self, now: float, waking: Iterable[str],
                 boot_seconds: Optional[Mapping[str, float]] = None, boots_version: int = 0
                 ) -> List[Tuple[int, float, List[Node]]]:
        """(job, start, nodes) per queued job the hook's forecast places; start
        ``now`` for a job that starts now. The answer is what the hook computes
        at ``now``; it is kept until the cluster or the hosts being woken
        change, or until `valid_until`. ``boot_seconds``: the hosts' measured
        boots (`waking_first`), changed in place only with ``boots_version``."""
        engine = self.engine
        if not engine.queue:
            return []
        key = (engine.version, frozenset(waking), boots_version)
        if self._last is None or self._last[0] != key or now > self._last[2]:
            result = self._compute(now, key[1], boot_seconds)
            self._last = (key, result, self._holds_until(now, result))
        return [(j, now if start is None else max(start, now), nodes)
                for j, start, nodes in self._last[1]]

    def valid_until(self) -> float:
        """Until when the last forecast holds on an unchanged cluster (inf: none made)."""
        return self._last[2] if self._last is not None else float("inf")

    def _holds_until(self, now: float, result) -> float:
        """The forecast depends on the time only where a job ends before the top
        blocked job's start (it may then start now on that job's vnodes): a
        job that does at ``now`` no longer does after that start less its walltime."""
        shadow = next((start for _j, start, _nodes in result if start is not None), None)
        if shadow is None:
            return float("inf")
        engine, until = self.engine, float("inf")
        for j in engine.queue:
            latest = shadow - engine.wall[j]
            if now <= latest < until:
                until = latest
        return until

    def _compute(self, now: float, waking: FrozenSet[str],
                 boot_seconds: Optional[Mapping[str, float]] = None
                 ) -> List[Tuple[int, Optional[float], List[Node]]]:
        engine = self.engine
        # A job takes whole 1-ncpus vnodes in order, awake ones first, so no
        # fit reaches past the first `width` awake and the first `width`
        # sleeping ones (in `waking_first`'s order).
        width = sum(engine.width[j] for j in engine.queue)
        awake, asleep = self._awake(width), self._asleep(waking, boot_seconds, width)
        if not awake and not asleep:
            # Every node runs a job: the forecast could only name busy nodes,
            # which the planner never acts on, so it changes no decision.
            return []
        requests = [self._request(j) for j in engine.queue]
        starts = forecast_whole_vnodes(requests, awake + asleep, self._running(), now)
        by_id = {engine.job_ids[j]: j for j in engine.queue}
        return [(by_id[s.job_id], s.start, [self._index[name] for name in s.vnodes])
                for s in starts]

    def _awake(self, most: int) -> List[VnodeSpace]:
        """The first ``most`` free vnodes (up, unmarked, no job), in node order."""
        nodes = self.engine.nodes
        free = [i for i in self.engine.state_index()[IDLE]
                if not nodes[i].marked and nodes[i].job is None and not nodes[i].failed]
        return [self._space(i, False) for i in heapq.nsmallest(most, free)]

    def _asleep(self, waking: FrozenSet[str], boot_seconds: Optional[Mapping[str, float]],
                most: int) -> List[VnodeSpace]:
        """The first ``most`` sleeping vnodes (marked, down, going down or coming up,
        no job) in `waking_first`'s order: hosts being woken in node order, then
        the rest fastest measured boot first (node order without measurements).
        Picked from the engine's state index, without walking every node."""
        engine, nodes = self.engine, self.engine.nodes
        index = engine.state_index()
        sleeping = index[DOWN] | index[BOOTING] | index[SHUTTING]
        sleeping.update(i for i in index[IDLE] if nodes[i].marked)
        candidates = [i for i in sleeping if nodes[i].job is None and not nodes[i].failed]
        first = sorted(i for i in candidates if nodes[i].name in waking) if waking else []
        left = most - len(first)
        if left <= 0:
            return [self._space(i, True) for i in first[:most]]
        if first:
            chosen = set(first)
            candidates = [i for i in candidates if i not in chosen]
        if boot_seconds:
            get, typical = boot_seconds.get, typical_boot(boot_seconds)
            rest = [i for _boot, i in heapq.nsmallest(
                left, [(get(nodes[i].name, typical), i) for i in candidates])]
        else:
            rest = heapq.nsmallest(left, candidates)
        return [self._space(i, True) for i in first + rest]

    def _space(self, idx: int, sleeping: bool) -> VnodeSpace:
        """The vnode of node ``idx`` as the hook reads it (made once, then kept)."""
        key = (idx, sleeping)
        space = self._spaces.get(key)
        if space is None:
            name = self.engine.nodes[idx].name
            space = self._spaces[key] = VnodeSpace(name, name, sleeping, {"ncpus": 1.0})
        return space

    def _request(self, j: int) -> JobRequest:
        request = self._requests.get(j)
        if request is None:
            engine = self.engine
            request = self._requests[j] = JobRequest(
                engine.job_ids[j], (Chunk(engine.width[j], (("ncpus", "1"),)),),
                walltime=engine.wall[j])
        return request

    def _running(self) -> List[Release]:
        """Running jobs' releases at start + walltime, in that order."""
        engine, out = self.engine, []
        for end, j in engine.ends:
            if engine.start[j] is None:
                continue                        # (slurm only: waiting for its nodes)
            rel = self._releases.get(j)
            if rel is None:
                rel = self._releases[j] = Release(end, engine.job_ids[j], tuple(
                    (engine.nodes[i].name, engine.nodes[i].name, _ONE, True)
                    for i in engine.alloc[j]))
            out.append(rel)
        return out
