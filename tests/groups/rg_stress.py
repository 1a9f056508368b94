"""Processes for the resource-group concurrency test (run as scripts, not by pytest).

    python rg_stress.py worker STATE_DIR SEED LIFECYCLES   # prolog/epilog-like lifecycles
    python rg_stress.py checker STATE_DIR SECONDS         # samples invariants while they run
    python rg_stress.py activate STATE_DIR GROUP          # one slow activation (to be killed)
"""
import json
import os
import random
import sys
import time

from pbs_power.groups.ledger import Book
from pbs_power.groups.service import ResourceGroupService

ENTITIES = ["n%03d" % i for i in range(1, 129)]


def worker(state_dir, seed, lifecycles):
    rng = random.Random(seed)
    svc = ResourceGroupService(state_dir, {"simulated": {"latency_ms": 1}})
    counts = {"activated": 0, "busy_entity": 0, "budget": 0}
    for i in range(lifecycles):
        name = "rg_%d_%d" % (os.getpid(), i)
        assert svc.create(name, i, rng.choice(["High", "Med", None])).status.ok
        answer = svc.add_resources(name, rng.sample(ENTITIES, rng.randint(1, 4)))
        if not answer.status.ok:
            counts["busy_entity"] += 1          # taken by another job: a real outcome
        else:
            r = svc.activate(name, strict=rng.random() < 0.3)
            counts["activated" if r.status.ok else "budget"] += 1
        deleted = svc.delete(name)
        if not deleted.status.ok:
            raise SystemExit("delete %s failed: %s" % (name, deleted.status.diag_msg))
    svc.close()
    print(json.dumps(counts))


def checker(state_dir, seconds):
    svc = ResourceGroupService(state_dir)
    topo, _ = svc.topology()
    samples = violations = 0
    end = time.time() + seconds
    while time.time() < end:
        with svc.store.transaction():
            usage = Book(topo, svc.store).usage
            dup = svc.store._rows("SELECT entity, COUNT(*) FROM members GROUP BY entity "
                                  "HAVING COUNT(*) > 1")
        over = [d for d, w in usage.items()
                if topo.domains[d].budget_watts is not None and w > topo.domains[d].budget_watts]
        violations += len(dup) + len(over)
        samples += 1
        time.sleep(0.01)
    svc.close()
    print(json.dumps({"samples": samples, "violations": violations}))


def activate(state_dir, group):
    svc = ResourceGroupService(state_dir, {"simulated": {"latency_ms": 5000}})
    print("started", flush=True)
    svc.activate(group)


if __name__ == "__main__":
    cmd, state_dir = sys.argv[1], sys.argv[2]
    if cmd == "worker":
        worker(state_dir, int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "checker":
        checker(state_dir, float(sys.argv[3]))
    else:
        activate(state_dir, sys.argv[3])
