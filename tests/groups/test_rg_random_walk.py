"""Random sequences of resource-group operations keep the power budget, step by step.

Seeded: every run walks the same sequences. Each sequence starts from a
fresh state and runs create/add/activate (strict or not, with or without
reprovision, partial thresholds, priorities), update, update-resources,
GPU limits, deactivate and delete, through devices that are healthy,
failing, failing at random or hanging past their timeout; after every step
the invariants of `rg_invariants` must hold.
"""
import os
import random
import subprocess
import time

from pbs_power.groups.gpu_policy import GPUPolicies, GPUPolicy
from pbs_power.groups.policy import PowerLimit
from pbs_power.groups.service import PartialActivation, ResourceGroupService
from pbs_power.groups.topology import parse_topology
from rg_invariants import violations

SEQUENCES = int(os.environ.get("PBS_POWER_RG_WALKS", "1000"))
STEPS = 14
NODES = ["n%d" % i for i in range(1, 9)]
POLICIES = [("High", 1000), ("Med", 700), ("Low", 500), ("Min", 300)]
TOPOLOGY = {
    "name": "walk",
    "device_specs": {"box": {"node": {"min_watts": 200, "idle_watts": 250, "max_watts": 1000},
                             "gpu": {"count": 2, "min_watts": 100, "max_watts": 400,
                                     "default_watts": 300}}},
    "power_domains": [{"name": "row", "budget_watts": 5000, "children": [
        {"name": "rack-a", "budget_watts": 2300}, {"name": "rack-b", "budget_watts": 2800}]}],
    "policies": [{"name": n, "limits": [{"element_type": "NODE", "power_limit": {"watts": w}}]}
                 for n, w in POLICIES] + [
        {"name": "GpuCap", "limits": [{"element_type": "NODE", "power_limit": {"watts": 800}},
                                      {"element_type": "GPU", "power_limit": {"watts": 200}}]}],
    "default_policy": "Low",
    "entities": [{"names": "n[1-4]", "device": "box", "domain": "rack-a"},
                 {"names": "n[5-8]", "device": "box", "domain": "rack-b", "policy": "Min"}],
}
DEVICES = [{}, {}, {"fail_devices": "n2"}, {"fail_devices": "n6,n7"},
           {"failure_rate": 0.3}, {"hang_devices": "n5"}]


class Walk:
    """Sequences over one state directory, through services that see different devices."""

    def __init__(self, state_dir):
        self.services = [ResourceGroupService(state_dir, {
            "simulated": dict({"latency_ms": 0, "seed": i}, **devices), "timeout_seconds": 0.02})
            for i, devices in enumerate(DEVICES)]
        self.rng, self.groups, self.counter = random.Random(0), [], 0

    def svc(self, i=0):
        return self.services[i]

    def restart(self, seed):
        """A fresh state: no group, an empty ledger, every device at its topology policy."""
        self.rng, self.groups, self.counter = random.Random(seed), [], 0
        svc = self.services[0]
        topo, _active = svc.topology()
        with svc.store.transaction():
            for table in ("members", "groups", "operations", "power_ledger"):
                svc.store._run("DELETE FROM %s" % table)
        answers = svc.controller.send([svc._request(topo, e, "topology_activate", {
            "policy_action": "set", "policy": topo.topology_policy(e).to_dict()}, 10.0)
            for e in topo.entities])
        assert all(a.success for a in answers.values())

    def close(self):
        for s in self.services:
            s.close()

    def step(self):
        rng = self.rng
        svc = self.svc(rng.randrange(len(DEVICES)))
        kind = rng.choice(["new", "new", "update", "resources", "gpu", "deactivate",
                           "delete", "delete", "reactivate", "crash"])
        name = rng.choice(self.groups) if self.groups else None
        if kind == "new" or name is None:
            return self.new(svc)
        if kind == "crash":
            return self.crash(svc)
        if kind == "update":
            return svc.update(name, rng.choice(["High", "Med", "Low", "Min", "GpuCap", None]),
                              strict=rng.random() < 0.3)
        if kind == "resources":
            members = [m.entity for m in svc.store.members(name)]
            return svc.update_resources(name, {rng.choice(members): rng.choice(
                ["High", "Med", "Min", None])})
        if kind == "gpu":
            members = [m.entity for m in svc.store.members(name)]
            limits = [rng.choice([None, 50, 150, 250, 400, 900]) for _ in range(2)]
            return svc.update_gpu_policies({rng.choice(members): GPUPolicies(tuple(
                GPUPolicy(i, None if w is None else PowerLimit(watts=w))
                for i, w in enumerate(limits)))})
        if kind == "deactivate":
            return svc.deactivate(name)
        if kind == "reactivate":
            return svc.activate(name, strict=rng.random() < 0.3,
                                allow_reprovision=rng.random() < 0.5)
        self.groups.remove(name)
        return svc.delete(name)

    def crash(self, svc):
        """An activation whose process dies after reserving, before its devices answer."""
        real = svc._applier

        def dying(topo, op):
            applier = real(topo, op)
            applier.sender = _die
            return applier
        svc._applier = dying
        try:
            self.new(svc)
        except _Died:
            pass
        finally:
            del svc._applier
        name = "g%d" % self.counter
        with svc.store.transaction():
            if svc.store.group(name).status == "activating":
                svc.store.set_group(name, owner_pid=DEAD_PID)
        return None

    def new(self, svc):
        rng = self.rng
        taken = {m for g in self.groups for m in (x.entity for x in svc.store.members(g))}
        free = [n for n in NODES if n not in taken]
        if not free:
            return None
        self.counter += 1
        name = "g%d" % self.counter
        svc.create(name, self.counter, rng.choice(["High", "Med", "Low", "GpuCap", None]),
                   dpm_enable=rng.random() < 0.9,
                   properties={"priority": rng.randrange(4),
                               **({"min_policy": "Low"} if rng.random() < 0.2 else {})})
        svc.add_resources(name, rng.sample(free, rng.randint(1, min(3, len(free)))))
        self.groups.append(name)
        partial = (PartialActivation(atleast_n_hosts=1) if rng.random() < 0.3 else None)
        return svc.activate(name, strict=rng.random() < 0.2, partial=partial,
                            allow_reprovision=rng.random() < 0.5)


class _Died(Exception):
    """The process 'died' here."""


def _die(pairs):
    raise _Died()


def _dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


DEAD_PID = _dead_pid()


def test_random_sequences_keep_the_budget_after_every_step(tmp_path):
    started = time.monotonic()
    setup = ResourceGroupService(str(tmp_path), {"simulated": {"latency_ms": 0}})
    assert setup.import_topology(parse_topology(TOPOLOGY)).ok
    assert setup.set_topology_active(True).status.ok
    setup.close()
    counts = {"steps": 0, "failed_answers": 0, "stepped down": 0, "lowered": 0, "raised": 0,
              "waiting": 0, "clamped": 0, "repaired": 0, "devices failed": 0}
    words = {"stepped down": "does not fit (", "lowered": "lowered ", "raised": "raised ",
             "waiting": " wait at ", "devices failed": "failed: "}
    walk = Walk(str(tmp_path))
    try:
        for seq in range(SEQUENCES):
            walk.restart(seq)
            assert violations(walk.svc()) == []
            for step in range(STEPS):
                answer = walk.step()
                status = getattr(answer, "status", answer)
                counts["steps"] += 1
                counts["failed_answers"] += bool(status is not None and not status.ok)
                text = str(getattr(status, "diag_msg", "")) + " ".join(
                    r.diag_msg for r in getattr(answer, "results", ()))
                for key, word in words.items():
                    counts[key] += word in text
                counts["clamped"] += "clamped" in text
                counts["repaired"] += "interrupted" in " ".join(
                    g.diag for g in walk.svc().store.groups())
                broken = violations(walk.svc())
                assert not broken, "sequence %d step %d: %s" % (seq, step, broken)
    finally:
        walk.close()
    elapsed = time.monotonic() - started
    print("random walk", SEQUENCES, "sequences", counts, "%.1f s" % elapsed)
    assert counts["steps"] == SEQUENCES * STEPS
    assert 0 < counts["failed_answers"] < counts["steps"]
    if SEQUENCES >= 1000:                                   # every path was walked
        assert all(counts[k] > 0 for k in counts), counts
