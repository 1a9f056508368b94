"""``pbs-power status`` and ``pbs-power history NODE``: the stores, for a person.

Both read the state directory read-only (`readers`) and return plain dicts
(the ``--json`` output); `status_text` and `history_text` lay those out on
one screen.
"""
from __future__ import annotations

import os
import re
import sqlite3
import time
from typing import Any, Dict, List, Optional

from pbs_power.groups import records
from pbs_power.states import journal
from .readers import GROUPS_DB, STATES_DB, Reader, open_ro

JOULES_PER_KWH = 3.6e6
WEEK_S = 7 * 86400.0
#: Lines of hosts in transition, failed hosts and domains shown on the screen.
SHOWN_HOSTS = 15
SHOWN_DOMAINS = 12
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def clear_command(host: str, reason: str) -> str:
    """What an admin runs once ``host`` is fixed (the next cycle forgets the failure)."""
    if "slurm" in reason.lower():
        return "scontrol update nodename=%s state=resume" % host
    return "pbsnodes -r %s" % host


def parse_since(text: str, now: float) -> float:
    """``--since``: an epoch, ``YYYY-MM-DD[THH:MM[:SS]]`` (local time) or ``30m``/``2h``/``7d``."""
    text = text.strip()
    found = _RELATIVE.match(text)
    if found:
        return now - float(found.group(1)) * _UNITS[found.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    for fmt in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M",
                "%Y-%m-%d"):
        try:
            return time.mktime(time.strptime(text, fmt))
        except ValueError:
            continue
    raise ValueError("--since %r: give an epoch, a date (2026-11-25 or 2026-11-25T08:00) "
                     "or an age (30m, 2h, 7d)" % text)


def _midnight(now: float) -> float:
    t = time.localtime(now)
    return time.mktime((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0, 0, 0, -1))


def _energy(state_dir: str, now: float) -> Dict[str, float]:
    try:
        conn = open_ro(os.path.join(state_dir, STATES_DB))
    except sqlite3.Error:
        return {"today": 0.0, "week": 0.0}
    try:
        return {"today": journal.energy_saved(conn, _midnight(now), now) / JOULES_PER_KWH,
                "week": journal.energy_saved(conn, now - WEEK_S, now) / JOULES_PER_KWH}
    finally:
        conn.close()


def status(state_dir: str, now: Optional[float] = None) -> Dict[str, Any]:
    """Nodes by state, transitions, failures, last cycle, energy, groups and budgets."""
    seen = Reader(state_dir).read(now)
    now = seen.now
    cycle, census = seen.last_cycle, seen.census
    energy = _energy(state_dir, now)
    return {
        "time": now,
        "state_dir": os.path.abspath(state_dir),
        "nodes": dict(census.states) if census else {},
        "nodes_at": census.started if census else None,
        "eligible": census.eligible if census else 0,
        "last_cycle": None if cycle is None else {
            "started": cycle.started, "seconds": round(cycle.seconds, 6),
            "outcome": cycle.outcome, "age_seconds": round(now - cycle.started, 1),
            "held_back": dict(census.held) if census else {}},
        "in_transition": [{"host": t.host, "kind": t.kind, "phase": t.phase,
                           "started": t.started, "phase_since": t.phase_since,
                           "reason": t.reason} for t in seen.in_flight],
        "failed": [{"host": h, "reason": r, "since": s, "clear": clear_command(h, r)}
                   for h, (r, s) in sorted(seen.failed.items())],
        "energy_saved_kwh": {"today": round(energy["today"], 3),
                             "last_7_days": round(energy["week"], 3),
                             "total": round(seen.energy_saved_joules / JOULES_PER_KWH, 3)},
        "power_saved_watts": round(seen.watts_saved, 1),
        "groups": dict(seen.groups_by_status),
        "domains": [{"name": d.name, "reserved_watts": d.reserved_watts,
                     "budget_watts": d.budget_watts,
                     "headroom_watts": None if d.budget_watts is None
                     else d.budget_watts - d.reserved_watts} for d in seen.domains],
        "errors": list(seen.errors),
    }


def _clock(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return "%ds" % seconds
    if seconds < 7200:
        return "%dm" % (seconds // 60)
    return "%.1fh" % (seconds / 3600.0)


def status_text(doc: Dict[str, Any]) -> str:
    """``status`` as one screen of text."""
    now = doc["time"]
    lines = ["pbs-power status at %s (%s)" % (_clock(now), doc["state_dir"])]
    nodes = doc["nodes"]
    if nodes:
        lines.append("nodes: %d  " % sum(nodes.values()) + "  ".join(
            "%s %d" % (s, nodes.get(s, 0)) for s in journal.NODE_STATES)
            + "  (eligible to power down: %d)" % doc["eligible"])
    else:
        lines.append("nodes: no cycle recorded yet")
    last = doc["last_cycle"]
    if last:
        held = ", ".join("%s %d" % kv for kv in sorted(last["held_back"].items()))
        took = ("%.1f ms" % (last["seconds"] * 1000) if last["seconds"] < 1
                else "%.1f s" % last["seconds"])
        lines.append("last cycle: %s, %s ago, %s in %s%s" % (
            _clock(last["started"]), _ago(last["age_seconds"]), last["outcome"], took,
            "; held back: " + held if held else ""))
    energy = doc["energy_saved_kwh"]
    lines.append("energy saved: today %.2f kWh, last 7 days %.2f kWh, total %.2f kWh; "
                 "saving %.0f W now" % (energy["today"], energy["last_7_days"],
                                        energy["total"], doc["power_saved_watts"]))
    flying = doc["in_transition"]
    lines.append("in transition: %d" % len(flying))
    for t in flying[:SHOWN_HOSTS]:
        lines.append("  %-16s %-9s %-13s since %s (%s)" % (
            t["host"], t["kind"], t["phase"], _clock(t["started"]),
            _ago(now - t["started"])))
    if len(flying) > SHOWN_HOSTS:
        lines.append("  ... %d more (--json lists all)" % (len(flying) - SHOWN_HOSTS))
    lines.append("failed, need an admin: %d" % len(doc["failed"]))
    for f in doc["failed"][:SHOWN_HOSTS]:
        lines.append("  %-16s since %s: %s" % (f["host"], _clock(f["since"]), f["reason"]))
        lines.append("  %-16s clear once fixed: %s" % ("", f["clear"]))
    if len(doc["failed"]) > SHOWN_HOSTS:
        lines.append("  ... %d more (--json lists all)" % (len(doc["failed"]) - SHOWN_HOSTS))
    groups = doc["groups"]
    lines.append("resource groups: " + (", ".join(
        "%s %d" % kv for kv in sorted(groups.items())) if groups else "none"))
    domains = sorted(doc["domains"], key=lambda d: (d["headroom_watts"] is None,
                                                    d["headroom_watts"] or 0.0, d["name"]))
    if len(domains) > SHOWN_DOMAINS:
        lines.append("  the %d power domains with the least headroom, of %d (--json lists all):"
                     % (SHOWN_DOMAINS, len(domains)))
    for d in domains[:SHOWN_DOMAINS]:
        if d["budget_watts"] is None:
            lines.append("  domain %-14s %8.0f W reserved, no budget" % (
                d["name"], d["reserved_watts"]))
        else:
            lines.append("  domain %-14s %8.0f W of %.0f W (headroom %.0f W)" % (
                d["name"], d["reserved_watts"], d["budget_watts"], d["headroom_watts"]))
    for error in doc["errors"]:
        lines.append("note: " + error)
    return "\n".join(lines)


def history(state_dir: str, host: str, since: Optional[float] = None,
            now: Optional[float] = None) -> Dict[str, Any]:
    """``host``'s power events and the groups it was in, oldest first, and where it is now."""
    now = time.time() if now is None else now
    entries: List[Dict[str, Any]] = []
    current: Dict[str, Any] = {"state": "unknown"}
    try:
        conn = open_ro(os.path.join(state_dir, STATES_DB))
    except sqlite3.Error:
        conn = None
    if conn is not None:
        try:
            for e in journal.events(conn, host, since):
                entries.append({"time": e.time, "what": "power", "kind": e.kind,
                                "event": e.event, "seconds": e.seconds, "reason": e.reason})
            current = _now_of(conn, host, now)
        finally:
            conn.close()
    try:
        gconn = open_ro(os.path.join(state_dir, GROUPS_DB))
    except sqlite3.Error:
        gconn = None
    if gconn is not None:
        try:
            for when, group, event, policy in records.entity_group_events(
                    gconn, host, since if since is not None else float("-inf")):
                entries.append({"time": when, "what": "group", "group": group,
                                "event": event, "policy": policy})
            rows = gconn.execute("SELECT m.group_name, g.status, COALESCE(m.applied_policy,"
                                 " m.policy, g.policy) FROM members m JOIN groups g ON"
                                 " g.name = m.group_name WHERE m.entity = ?",
                                 (host,)).fetchall() if _has_groups(gconn) else []
            current["group"] = ({"name": rows[0][0], "status": rows[0][1],
                                 "policy": rows[0][2]} if rows else None)
        finally:
            gconn.close()
    entries.sort(key=lambda e: e["time"])
    return {"host": host, "since": since, "time": now, "events": entries, "now": current}


def _has_groups(conn) -> bool:
    return bool(conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'members'").fetchone())


def _now_of(conn, host: str, now: float) -> Dict[str, Any]:
    """Where ``host`` is now, as the state store knows it."""
    def one(sql):
        try:
            return conn.execute(sql, (host,)).fetchone()
        except sqlite3.OperationalError:
            return None
    row = one("SELECT reason, since FROM failed_hosts WHERE host = ?")
    if row:
        return {"state": "failed", "since": row[1], "reason": row[0],
                "clear": clear_command(host, row[0])}
    row = one("SELECT kind, phase, started FROM transitions WHERE host = ?")
    if row:
        return {"state": row[1], "kind": row[0], "since": row[2]}
    row = one("SELECT kind, since, watts FROM saving_now WHERE host = ?")
    if row:
        return {"state": "asleep" if row[0] == "sleep" else "off", "since": row[1],
                "saving_watts": row[2]}
    return {"state": "on (as far as the store knows)"}


def history_text(doc: Dict[str, Any]) -> str:
    """``history`` as text: one line per event, then where the host is now."""
    since = " since %s" % _clock(doc["since"]) if doc["since"] is not None else ""
    lines = ["history of %s%s" % (doc["host"], since)]
    if not doc["events"]:
        lines.append("  (no events recorded)")
    for e in doc["events"]:
        if e["what"] == "power":
            detail = "in %ds" % round(e["seconds"]) if e["seconds"] is not None else ""
            if e["reason"] and e["reason"] != "done":
                detail = "; ".join(x for x in (detail, e["reason"]) if x)
            lines.append("  %s  %-9s %-9s %s" % (_clock(e["time"]), e["kind"], e["event"],
                                                 detail))
        else:
            lines.append("  %s  group %s %s%s" % (
                _clock(e["time"]), e["group"], e["event"],
                " (policy %s)" % e["policy"] if e["policy"] else ""))
    cur = doc["now"]
    where = cur["state"]
    if "since" in cur:
        where += " since %s" % _clock(cur["since"])
    if cur.get("saving_watts"):
        where += ", saving %.0f W" % cur["saving_watts"]
    if cur.get("clear"):
        where += "; clear once fixed: %s" % cur["clear"]
    group = cur.get("group")
    where += "; group %s (%s, policy %s)" % (group["name"], group["status"], group["policy"]) \
        if group else "; in no resource group"
    lines.append("now: " + where)
    return "\n".join(lines)
