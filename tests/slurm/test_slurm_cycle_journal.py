"""`pbs-power slurm cycle` leaves one journal row per pass, as the PBS hook does."""
import logging

import pytest

from pbs_power.config.hook_config import parse_config
from pbs_power.slurm.adapter import SlurmClient, SlurmError, SlurmNode, SlurmPowerConfig
from pbs_power.slurm.cycle import run_cycle
from pbs_power.states import journal, tally
from pbs_power.states.store import Store

T0 = 1_800_000_000.0


class Nodes(SlurmClient):
    """Four idle nodes (n4 powered down), or a slurmctld that does not answer."""

    name = "stand-in"

    def __init__(self, down: bool = False):
        self.down = down

    def nodes(self):
        if self.down:
            raise SlurmError("sinfo: slurm_load_node error: Unable to contact slurm controller")
        return [SlurmNode("n%d" % i, "IDLE", frozenset({"POWERED_DOWN"}) if i == 4 else
                          frozenset(), last_busy=T0 - 7200) for i in (1, 2, 3, 4)]

    def jobs(self):
        return []

    def reservations(self):
        return []

    def power_config(self):
        return SlurmPowerConfig(resume_timeout=600, suspend_timeout=60)

    def update_nodes(self, nodes, state, reason=""):
        pass


def test_a_pass_and_a_failed_query_are_journaled(tmp_path):
    config = parse_config({"power_on_off_enable": True, "max_concurrent_nodes": 2,
                           "node_idle_limit": 600, "state_dir": str(tmp_path)})
    log = logging.getLogger("test.slurm_cycle_journal")
    with Store.open(str(tmp_path)) as store:
        report = run_cycle(config, store, Nodes(), log, T0, dry_run=True)
        with pytest.raises(SlurmError):
            run_cycle(config, store, Nodes(down=True), log, T0 + 300)
        ran, failed = journal.last_cycles(store, 2)[::-1]
        rows = journal.tallies(store)
    assert len(report.plan.actions) == 2 and len(report.plan.deferred) == 1
    assert ran.outcome == "ran" and ran.started == T0 and ran.hosts == 4
    assert ran.states["off"] == 1                      # n4: Slurm powered it down itself
    assert ran.held == {"max_concurrent_nodes": 1}
    assert failed.outcome == "query_failed" and failed.states == {}
    assert tally.counter(rows, "cycles") == {(("outcome", "ran"),): 1.0,
                                             (("outcome", "query_failed"),): 1.0}
