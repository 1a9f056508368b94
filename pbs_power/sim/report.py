"""Present a `Comparison`: the side-by-side table, JSON, and the plot."""
from __future__ import annotations

from typing import Any, Dict, List

from .simulate import Comparison

#: (metric attribute, column title, format)
COLUMNS = (
    ("energy_kwh", "energy kWh", "{:,.0f}"),
    ("saved_pct", "saved %", "{:.1f}"),
    ("added_wait_mean_s", "added wait mean s", "{:,.0f}"),
    ("added_wait_p95_s", "p95 s", "{:,.0f}"),
    ("added_wait_max_s", "max s", "{:,.0f}"),
    ("start_change_mean_s", "start change mean s", "{:,.0f}"),
    ("jobs_delayed_pct", "delayed %", "{:.1f}"),
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
    """Write a PNG readable at a glance: one row per manager (its cluster power over
    always-on's in grey, and its nodes asleep or off), and bars of energy saved and mean
    added wait per manager on the right."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [n for n, samples in result.samples.items() if samples]
    rows = max(1, len(names))
    fig = plt.figure(figsize=(13, 2.2 * rows + 1.0))
    grid = fig.add_gridspec(rows, 2, width_ratios=(4, 1.3))
    base = result.samples.get("always-on") or []
    first = ax = None
    for i, name in enumerate(names):
        ax = fig.add_subplot(grid[i, 0], sharex=first)
        first = first or ax
        _power_panel(ax, name, result.samples[name], base)
        if i < rows - 1:
            ax.tick_params(labelbottom=False)
    if ax is not None:
        ax.set_xlabel("days since the first job (SIMULATED; grey: always-on's power)")
    _bars(fig.add_subplot(grid[: max(1, rows // 2), 1]), result, "saved_pct",
          "energy saved vs always-on (%)")
    _bars(fig.add_subplot(grid[max(1, rows // 2):, 1] if rows > 1 else grid[0, 1]), result,
          "added_wait_mean_s", "mean added wait (s)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _power_panel(ax: Any, name: str, samples: List[Any], base: List[Any]) -> None:
    """One manager: cluster power (kW, left axis) over always-on's, nodes down (right axis)."""
    t0 = samples[0][0]
    if base and name != "always-on":
        ax.plot([(s[0] - t0) / 86400.0 for s in base], [s[1] / 1000.0 for s in base],
                color="0.75", linewidth=0.7)
    ax.plot([(s[0] - t0) / 86400.0 for s in samples], [s[1] / 1000.0 for s in samples],
            color="tab:blue", linewidth=0.8)
    ax.set_ylabel("kW")
    ax.text(0.01, 0.92, name, transform=ax.transAxes, fontweight="bold", va="top",
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8})
    if any(s[3] for s in samples):
        down = ax.twinx()
        down.fill_between([(s[0] - t0) / 86400.0 for s in samples], [s[3] for s in samples],
                          step="post", color="tab:orange", alpha=0.3, linewidth=0)
        down.set_ylabel("nodes down", color="tab:orange", fontsize="small")


def _bars(ax: Any, result: Comparison, field: str, label: str) -> None:
    """One horizontal bar per manager for one metric, its value written beside it."""
    names = [m.manager for m in result.metrics]
    values = [getattr(m, field) for m in result.metrics]
    ax.barh(names, values, color="tab:green" if field == "saved_pct" else "tab:red")
    ax.invert_yaxis()
    ax.set_title(label, fontsize="small")
    for y, v in enumerate(values):
        ax.text(v, y, " %s" % format(round(v, 1), ","), va="center", fontsize="small")
    ax.margins(x=0.25)
