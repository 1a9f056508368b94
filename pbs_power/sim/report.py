"""Present a `Comparison`: the side-by-side table, JSON, and the plot."""
from __future__ import annotations

from typing import Any, Dict

from .simulate import Comparison

#: (metric attribute, column title, format)
COLUMNS = (
    ("energy_kwh", "energy kWh", "{:,.0f}"),
    ("saved_pct", "saved %", "{:.1f}"),
    ("added_wait_mean_s", "added wait mean s", "{:,.0f}"),
    ("added_wait_p95_s", "p95 s", "{:,.0f}"),
    ("added_wait_max_s", "max s", "{:,.0f}"),
    ("jobs_delayed_by_power_pct", "delayed by power %", "{:.1f}"),
    ("power_cycles_per_node_day", "cycles/node-day", "{:.2f}"),
    ("peak_ramp_w_per_min", "peak ramp W/min", "{:,.0f}"),
    ("minutes_over_ramp_limit", "min over ramp", "{:d}"),
)


def table(result: Comparison) -> str:
    """One row per manager, one column per metric, aligned for a terminal."""
    head = ["manager"] + [title for _, title, _ in COLUMNS]
    rows = [[m.manager] + [fmt.format(getattr(m, attr)) for attr, _, fmt in COLUMNS]
            for m in result.metrics]
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths)))
             for r in [head] + rows]
    return "\n".join([lines[0], "-" * len(lines[0])] + lines[1:])


def as_json(result: Comparison, **context: Any) -> Dict[str, Any]:
    """The metrics per manager, with what was simulated."""
    doc: Dict[str, Any] = dict(context)
    doc.update(jobs=result.jobs, nodes=result.nodes, days=round(result.span_s / 86400.0, 2),
               managers={m.manager: m.as_dict() for m in result.metrics})
    return doc


def plot(result: Comparison, path: str, title: str = "") -> None:
    """Write a PNG: cluster power, and nodes on / down, over time per manager."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    for name, samples in result.samples.items():
        if not samples:
            continue
        t0 = samples[0][0]
        days = [(s[0] - t0) / 86400.0 for s in samples]
        line, = top.plot(days, [s[1] / 1000.0 for s in samples], label=name, linewidth=0.8)
        bottom.plot(days, [s[2] for s in samples], color=line.get_color(), linewidth=0.8,
                    label="%s: on" % name)
        if any(s[3] for s in samples):
            bottom.plot(days, [s[3] for s in samples], color=line.get_color(),
                        linestyle="--", linewidth=0.8, label="%s: asleep/off" % name)
    top.set_ylabel("cluster power (kW)")
    top.legend(loc="upper right", fontsize="small")
    bottom.set_ylabel("nodes")
    bottom.set_xlabel("days since the first job (SIMULATED)")
    bottom.legend(loc="upper right", fontsize="x-small", ncol=2)
    if title:
        top.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

