"""The shipped Grafana dashboard queries only what the exporter exports, in valid PromQL."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pbs_power.metrics.families import exported_names

DASHBOARD = Path(__file__).resolve().parents[2] / "config" / "grafana-dashboard.json"
PROMTOOL = shutil.which("promtool")
#: Grafana's own variables, replaced by what Grafana would put there.
GRAFANA_VARS = {"$__range": "1d", "$__rate_interval": "5m", "$__interval": "1m"}
KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
            "group_left", "group_right", "inf", "nan"}


def expressions():
    doc = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in doc["panels"] for t in p.get("targets", ())]


def concrete(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    return expr


def metric_names(expr: str) -> set:
    """Identifiers in ``expr`` that name series (not functions, labels, keywords, numbers)."""
    text = re.sub(r'"[^"]*"', "", expr)                       # label values
    text = re.sub(r"\{[^}]*\}", "", text)                     # matchers
    text = re.sub(r"\[[^\]]*\]", "", text)                    # ranges
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"(?<![\w.])\d+(\.\d+)?(e[+-]?\d+)?", "", text)
    names = set()
    for found in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        rest = text[found.end():].lstrip()
        if rest.startswith("(") or found.group().lower() in KEYWORDS:
            continue                                           # a function or keyword
        names.add(found.group())
    return names


def test_every_expression_names_only_exported_metrics():
    exported = set(exported_names())
    found = expressions()
    assert len(found) >= 20
    for title, expr in found:
        names = metric_names(concrete(expr))
        assert names, (title, expr)
        assert names <= exported, (title, expr, names - exported)


def test_the_name_check_itself_catches_a_metric_that_is_not_exported():
    assert metric_names('sum by (state) (pbs_power_nodez{state="on"}) / 3.6e6') == {
        "pbs_power_nodez"}
    assert not {"pbs_power_nodez"} <= set(exported_names())


def test_dashboard_shows_what_an_admin_asks_every_morning():
    everything = set().union(*(metric_names(concrete(e)) for _t, e in expressions()))
    for needed in ("pbs_power_nodes", "pbs_power_energy_saved_joules_total",
                   "pbs_power_transitions_failed_total", "pbs_power_jobs_waited_for_wake_total",
                   "pbs_power_wake_wait_seconds_bucket", "pbs_power_domain_budget_watts",
                   "pbs_power_domain_reserved_watts"):
        assert needed in everything, needed
    doc = json.loads(DASHBOARD.read_text())
    assert doc["__inputs"][0]["name"] == "DS_PROMETHEUS"
    for p in doc["panels"]:
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (package prometheus)")
def test_promtool_parses_every_expression(tmp_path):
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": "dashboard:panel_%d" % i, "expr": concrete(expr)}
        for i, (_title, expr) in enumerate(expressions())]}]}
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps(rules))
    out = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: %d rules found" % len(expressions()) in out.stdout + out.stderr
    # and the same check refuses a broken expression
    rules["groups"][0]["rules"][0]["expr"] = "sum(pbs_power_nodes"
    path.write_text(json.dumps(rules))
    bad = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert bad.returncode != 0
