"""slurmctld's power save in the simulator (src/slurmctld/power_save.c, pass by pass)."""
from __future__ import annotations

import math
from collections import deque
from typing import Deque, List, Optional

from pbs_power.config.hook_config import MODE_RAMP_RATE, HookConfig
from .manager import Manager
from .nodes import BOOTING, BUSY, HELD, IDLE, Node

#: slurm.conf defaults (nodes per minute) for SuspendRate and ResumeRate
#: (src/common/read_config.h), and slurmctld's power save pass (power_save.c).
SLURM_SUSPEND_RATE = 60
SLURM_RESUME_RATE = 300
SLURM_PASS_S = 10
#: ResumeTimeout as a site sets it: above its longest boot (the default, 60 s,
#: is shorter than most boots and would set every resumed node DOWN): this,
#: or half as long again as the simulated nodes' longest boot if that reaches it.
SLURM_RESUME_TIMEOUT = 600.0
#: How often the model looks again at nodes SuspendExcNodes=ALL:N spares.
SPARE_RECHECK_S = 60.0


class _Tokens:
    """slurmctld's rate limit: one token per 60/rate s, at most rate x pass / 60 kept.

    power_save.c power_save_rl_setup(): refill_period_msec = 60000 / rate,
    max_tokens = rate * power_save_interval / 60 (at least 1), no tokens at
    start (_rl_init); _rl_get_tokens() adds the whole periods passed.
    """

    def __init__(self, per_minute: int, start: float):
        self.rate = int(per_minute)
        self.period_ms = 60000 // self.rate if self.rate > 0 else 0
        self.cap = max(1, self.rate * SLURM_PASS_S // 60)
        self.tokens = 0
        self.last = self._periods(start)

    def _periods(self, now: float) -> int:
        return int(round(now * 1000.0)) // self.period_ms if self.period_ms else 0

    def get(self, now: float) -> int:
        """Tokens now (1 << 30 when the rate is 0: unlimited)."""
        if self.rate <= 0:
            return 1 << 30
        periods = self._periods(now)
        if periods > self.last:
            self.tokens = min(self.cap, self.tokens + periods - self.last)
            self.last = periods
        return self.tokens

    def spend(self) -> None:
        if self.rate > 0 and self.tokens:
            self.tokens -= 1


class SlurmPowerSave(Manager):
    """slurmctld's power save (src/slurmctld/power_save.c), pass by pass.

    Every power_save_interval (10 s) a pass resumes the powered-down nodes
    allocated to jobs, then suspends the idle nodes whose last_busy is more
    than SuspendTime (= node_idle_limit) ago, each spending a ResumeRate or
    SuspendRate token (defaults 300 and 60 per minute). SuspendExcNodes
    (= exclude_nodes) are never suspended; with min_idle_nodes N it is
    ``ALL:N``: each pass spares the first N idle nodes less the allocated
    ones (_pick_exc_nodes). A node booting longer than ResumeTimeout is set
    DOWN and its job requeued. Passes run only when there is work, at the
    times the 10 s loop would have run them.
    """

    name = "slurm"
    scheduler = "slurm"

    def __init__(self, config: HookConfig, suspend_rate: int = SLURM_SUSPEND_RATE,
                 resume_rate: int = SLURM_RESUME_RATE,
                 resume_timeout: Optional[float] = None):
        self.suspend_time = float(config.node_idle_limit)
        self.suspend_rate, self.resume_rate = suspend_rate, resume_rate
        #: None: as a site sets it, from the nodes' boots (`attach`)
        self.resume_timeout = resume_timeout
        self.excluded = config.excluded_hosts
        self.keep_up = int(config.min_idle_nodes)
        self.sleep_mode = config.mode == MODE_RAMP_RATE
        self._to_resume: Deque[Node] = deque()
        self._idle: set = set()                  # node indexes that may become suspendable
        self._passes: set = set()                # pass times with a timer set
        self.t0 = 0.0

    def attach(self, engine) -> None:
        super().attach(engine)
        self.t0 = engine.submit[0] if engine.submit else 0.0
        if self.resume_timeout is None:
            longest = max((n.boot_s for n in engine.nodes), default=0.0)
            longest *= 1.0 + engine.model.boot_noise
            self.resume_timeout = (SLURM_RESUME_TIMEOUT if longest < SLURM_RESUME_TIMEOUT
                                   else 1.5 * longest)
        self.suspends = _Tokens(self.suspend_rate, self.t0)
        self.resumes = _Tokens(self.resume_rate, self.t0)
        self.on_idle(list(engine.nodes), self.t0)

    def _pass_at(self, at: float) -> None:
        """Run a pass at the first 10 s tick at or after ``at``."""
        k = math.ceil((at - self.t0) / SLURM_PASS_S - 1e-9)
        tick = self.t0 + max(0, k) * SLURM_PASS_S
        if tick not in self._passes:
            self._passes.add(tick)
            self.engine.timer(tick, ("pass",))

    def on_idle(self, nodes: List[Node], now: float) -> None:
        if self.suspend_time < 0:
            return
        for node in nodes:
            if node.name not in self.excluded:
                self._idle.add(node.idx)
                # last_busy < now - SuspendTime: the first tick strictly after
                self._pass_at(node.idle_since + self.suspend_time + 1e-6)

    def on_up(self, node: Node, now: float) -> None:
        if node.job is None:
            self.on_idle([node], now)

    def on_allocated_down(self, nodes: List[Node], now: float) -> None:
        self._to_resume.extend(nodes)
        self._pass_at(now)

    def on_timer(self, now: float, arg) -> None:
        if arg[0] == "resume-timeout":
            node = arg[1]
            if node.state == BOOTING and node.job is not None:
                self.engine.fail(node, now)
                self.engine.requeue(node.job, now)
            return
        self._passes.discard(now)
        self._pass(now)

    def _pass(self, now: float) -> None:
        engine = self.engine
        while self._to_resume and self.resumes.get(now) > 0:
            node = self._to_resume.popleft()
            if node.job is not None and engine.power_up(node, now):
                self.resumes.spend()
                engine.timer(now + self.resume_timeout, ("resume-timeout", node))
        spare = self._spared()
        waiting = held = False
        for idx in sorted(self._idle):
            node = engine.nodes[idx]
            if node.state != IDLE or node.job is not None or node.failed:
                self._idle.discard(idx)
                continue
            if not node.idle_since < now - self.suspend_time:
                continue
            if idx in spare:
                held = True
                continue
            if self.suspends.get(now) <= 0:
                waiting = True
                break
            if engine.power_down(node, now):
                self.suspends.spend()
                self._idle.discard(idx)
        if waiting or self._to_resume:
            self._pass_at(now + SLURM_PASS_S)
        elif held:
            # Jobs starting shrink the spared set without telling the
            # manager: look again a minute later (not every 10 s pass).
            self._pass_at(now + SPARE_RECHECK_S)

    def _spared(self) -> set:
        """SuspendExcNodes=ALL:N: the first N idle nodes less the allocated ones."""
        if not self.keep_up:
            return set()
        engine = self.engine
        left = self.keep_up - engine.count[BUSY] - engine.count[HELD]
        spare = set()
        for node in engine.nodes:
            if left <= 0:
                break
            if node.state == IDLE and node.job is None and not node.failed:
                spare.add(node.idx)
                left -= 1
        return spare
