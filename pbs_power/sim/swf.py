"""Read real job traces in the Standard Workload Format (SWF) for the simulator.

The Parallel Workloads Archive (https://www.cs.huji.ac.il/labs/parallel/workload/)
publishes production logs as SWF: one job per line, 18 whitespace-separated
numeric fields, `-1` for "unknown", and `;` comment lines holding a header of
`; Label: value` pairs. `read_swf` turns such a file (plain or gzip) into a
`Trace` of cleaned `SWFJob` records plus a `ReadReport` saying what was skipped
and why, so that a replay states exactly which part of the log it used.
`Trace.sim_jobs` maps the jobs onto the simulator's `SimJob`.

Reading never fails on bad data: malformed lines are counted and skipped, with
a few examples kept for the report. Only a missing file or bad arguments raise.
"""
from __future__ import annotations

import gzip
import math
import os
import re
import zlib
from dataclasses import dataclass, replace
from operator import attrgetter
from pathlib import Path
from typing import IO, Iterable, List, Optional, Sequence, Tuple, Union

from .workload import SimJob

#: Number of fields on every SWF job line.
SWF_FIELDS = 18
#: How many malformed-line examples a `ReadReport` keeps.
MAX_EXAMPLES = 5
GZIP_MAGIC = b"\x1f\x8b"
#: Why a job line was dropped (keys of the counts in `ReadReport`).
NEVER_RAN, NO_PROCS, OUT_OF_WINDOW = "never_ran", "no_procs", "out_of_window"

#: A real two-week window of the KTH-SP2 log shipped with the package
#: (see `pbs_power/sim/data/README.md`). Its job lines are the original's,
#: unchanged, so read it with `SAMPLE_WINDOW` to start the clock at zero.
SAMPLE_PATH = Path(__file__).resolve().parent / "data" / "kth-sp2-window.swf.gz"
#: Monday 1996-11-18 00:00 to Monday 1996-12-02 00:00, Europe/Stockholm, in
#: seconds after the original header's UnixStartTime.
SAMPLE_WINDOW = (4791569.0, 6001169.0)

_HEADER_KEY = re.compile(r";\s*([A-Z][A-Za-z]*):(?:\s+(.*))?$")
_LEADING_INT = re.compile(r"\s*([+-]?\d+)")
_WINDOW_PART = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([dhms]?)\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class SWFHeader:
    """What the `; Label: value` header comments say about the machine.

    `max_nodes` and `max_procs` take the leading integer of their field, as
    CTC-SP2's `MaxNodes: 338 (batch partition; 512 total)` reads; a missing or
    non-positive value is None. `notes` are the `Note:` lines, each joined
    with its indented continuation lines. `unix_start_time` is the epoch that
    submit times count from (shifted by the window start when a window is read).
    """

    max_nodes: Optional[int] = None
    max_procs: Optional[int] = None
    unix_start_time: Optional[int] = None
    time_zone_string: Optional[str] = None
    installation: str = ""
    computer: str = ""
    notes: Tuple[str, ...] = ()


@dataclass(frozen=True)
class SWFJob:
    """One job as logged, cleaned of the format's `-1` markers where it matters.

    `procs` is the allocated processor count (field 5), or the requested one
    (field 8) when none was logged. `wait` and `requested_time` are None when
    unknown; `run_time` is 0 when the log has none. `submit` is in seconds after
    the trace (or window) start.
    """

    job_id: int
    submit: float
    wait: Optional[float]
    run_time: float
    procs: int
    requested_procs: Optional[int]
    requested_time: Optional[float]
    status: int
    user: int
    queue: int
    partition: int


@dataclass(frozen=True)
class ReadReport:
    """Counts of what `read_swf` read and skipped, for people and for tests.

    `lines` counts every physical line read, `comments` the `;` lines, `jobs`
    the jobs kept; each `dropped_*` counts valid job lines left out, and
    `malformed` the lines that are not 18 numeric fields (`first_malformed`
    keeps up to five `"line N: why"` examples). `source` names the file.
    """

    lines: int
    jobs: int
    comments: int
    malformed: int
    dropped_never_ran: int
    dropped_no_procs: int
    dropped_out_of_window: int
    first_malformed: Tuple[str, ...]
    source: str = ""

    def summary(self) -> str:
        """One line: jobs kept, then each non-empty class of skipped lines."""
        head = "%s: %s jobs" % (self.source or "trace", format(self.jobs, ","))
        return summary_line(head, ((self.dropped_never_ran, "never ran"),
                                   (self.dropped_no_procs, "without processors"),
                                   (self.dropped_out_of_window, "outside the window")),
                            self.malformed, self.first_malformed)


def summary_line(head: str, dropped: Iterable[Tuple[int, str]], malformed: int,
                 first_malformed: Sequence[str]) -> str:
    """``head``, then each non-empty class of skipped records and the first bad one."""
    skipped = ["%s %s" % (format(count, ","), what) for count, what in dropped if count]
    if malformed:
        example = (" (%s%s)" % (first_malformed[0], ", ..." if malformed > 1 else "")
                   if first_malformed else "")
        skipped.append("%s malformed%s" % (format(malformed, ","), example))
    return head + ("; skipped " + ", ".join(skipped) if skipped else "; nothing skipped")


@dataclass(frozen=True)
class Trace:
    """A read SWF log: its name, header, kept jobs (sorted by submit) and report."""

    name: str
    header: SWFHeader
    jobs: Tuple[SWFJob, ...]
    report: ReadReport

    def sim_jobs(self, cores_per_node: int = 1, nodes: Optional[int] = None,
                 start: float = 0.0) -> List[SimJob]:
        """The jobs as simulator `SimJob`s, submitted at `start + submit`.

        A job needs `ceil(procs / cores_per_node)` nodes, capped at `nodes`
        (default: the header's MaxNodes; no cap when neither is known), since
        a simulated cluster cannot run a job wider than itself. Run time is at
        least 1 s. The walltime is the user's request, or the run time when
        there is none or the request is shorter than the run: the real
        scheduler would have killed such jobs, but the archive keeps them, and
        a replay must not end a job before its logged run time.
        """
        if cores_per_node < 1:
            raise ValueError("cores_per_node must be >= 1, got %r" % (cores_per_node,))
        cap = node_cap(nodes, self.header.max_nodes)
        out = []
        for job in self.jobs:
            width = min(-(-job.procs // cores_per_node), cap)
            runtime = max(1.0, job.run_time)
            walltime = max(runtime, job.requested_time or 0.0)
            out.append(SimJob(str(job.job_id), start + job.submit, width, runtime, walltime))
        return out


def node_cap(nodes: Optional[int], default: Optional[int]) -> float:
    """The widest job a replay allows: ``nodes``, else ``default``, else no cap."""
    cap = nodes if nodes is not None else default
    if cap is None:
        return math.inf
    if cap < 1:
        raise ValueError("nodes must be >= 1, got %r" % (cap,))
    return cap


def parse_window(text: str) -> Tuple[float, float]:
    """Parse `"START:END"` into seconds; each side is a number with an optional
    unit `d`, `h`, `m` or `s` (`"0:86400"`, `"2d:9d"`, `"36h:48h"`).

    Raises ValueError, naming the bad part, when the text does not parse or
    END is not after START.
    """
    if text.count(":") != 1:
        raise ValueError("window %r: expected START:END, e.g. 0:86400 or 2d:9d" % (text,))
    bounds = []
    for side, part in zip(("START", "END"), text.split(":")):
        match = _WINDOW_PART.match(part)
        if not match:
            raise ValueError("window %r: %s %r is not a number of seconds with an "
                             "optional unit d, h, m or s" % (text, side, part.strip()))
        bounds.append(float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()])
    if bounds[1] <= bounds[0]:
        raise ValueError("window %r: END must be after START" % (text,))
    return bounds[0], bounds[1]


def parse_header(comments: Iterable[str]) -> SWFHeader:
    """Build an `SWFHeader` from the `;` comment lines of an SWF file.

    Labels are `; Label: value` with a capitalised label; other comment lines
    continue the label before them (only `Note` continuations are kept).
    """
    fields = {}
    notes: List[str] = []
    last = ""
    for raw in comments:
        line = raw.strip()
        match = _HEADER_KEY.match(line)
        if match:
            last, value = match.group(1), (match.group(2) or "").strip()
            if last == "Note":
                notes.append(value)
            else:
                fields.setdefault(last, value)
        elif last == "Note" and line.lstrip(";").strip():
            notes[-1] = (notes[-1] + " " + line.lstrip(";").strip()).strip()
    return SWFHeader(
        max_nodes=_positive(_leading_int(fields.get("MaxNodes", ""))),
        max_procs=_positive(_leading_int(fields.get("MaxProcs", ""))),
        unix_start_time=_leading_int(fields.get("UnixStartTime", "")),
        time_zone_string=fields.get("TimeZoneString") or None,
        installation=fields.get("Installation", ""),
        computer=fields.get("Computer", ""),
        notes=tuple(notes))


def _leading_int(text: str) -> Optional[int]:
    """The integer a header value starts with, or None."""
    match = _LEADING_INT.match(text)
    return int(match.group(1)) if match else None


def _positive(value: Optional[int]) -> Optional[int]:
    """`value` when it is a usable count (> 0); logs write -1 for unknown."""
    return value if value is not None and value > 0 else None


def _open_text(path: PathLike) -> IO[str]:
    """Open `path` as text, gunzipping when it starts with the gzip magic bytes.

    The content decides, not the name; bytes that are not UTF-8 become U+FFFD
    (and so make their line malformed, or an odd character in a comment).
    """
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == GZIP_MAGIC:
        return gzip.open(path, "rt", encoding="utf-8", errors="replace", newline=None)
    return open(path, "r", encoding="utf-8", errors="replace", newline=None)


def _why_malformed(parts: List[str]) -> str:
    """Why a non-comment line is not a job line (it has a non-numeric field or a wrong count)."""
    if len(parts) != SWF_FIELDS:
        return "%d fields, need %d" % (len(parts), SWF_FIELDS)
    for number, part in enumerate(parts, 1):
        try:
            if math.isfinite(float(part)):
                continue
        except ValueError:
            pass
        return "field %d is not a number: %r" % (number, part[:20])
    return "numbers too large to add up"


def drop_reason(v: Sequence[float]) -> Optional[str]:
    """Why a well-formed job line (18 numbers) is not a job to replay, or None.

    NEVER_RAN: an LLNL-Thunder-style placeholder (submit -1), or no run time
    (-1 or 0) with no allocated processors: cancelled before it started.
    NO_PROCS: neither allocated (field 5) nor requested (field 8) processors.
    """
    if v[1] < 0 or (v[3] <= 0 and v[4] <= 0):
        return NEVER_RAN
    if v[4] <= 0 and v[7] <= 0:
        return NO_PROCS
    return None


def job_from_fields(v: Sequence[float], shift: float = 0.0) -> SWFJob:
    """The `SWFJob` of a kept job line, its submit time moved back by `shift`."""
    run, alloc, req = v[3], v[4], v[7]
    return SWFJob(int(v[0]), v[1] - shift, v[2] if v[2] >= 0 else None,
                  run if run > 0 else 0.0, int(alloc if alloc > 0 else req),
                  int(req) if req > 0 else None, v[8] if v[8] > 0 else None,
                  int(v[10]), int(v[11]), int(v[14]), int(v[15]))


def read_swf(path: PathLike, window: Optional[Tuple[float, float]] = None,
             limit: Optional[int] = None) -> Trace:
    """Read an SWF log (`.swf` or gzip, told apart by content) into a `Trace`.

    `window=(start, end)` keeps jobs submitted in `[start, end)` seconds after
    the trace start and re-bases them (and the header's UnixStartTime) so the
    window starts at 0. `limit` stops after that many kept jobs (for tests and
    samples). Skipped, and counted in the report: lines that are not 18
    numeric fields (malformed); placeholders with submit -1, and jobs with no
    run time (-1 or 0) and no allocated processors (never ran: cancelled
    before starting); jobs with neither allocated nor requested processors
    (no procs). Jobs come back sorted by submit time (stable).
    """
    if window is not None and not window[1] > window[0]:
        raise ValueError("window end must be after its start, got %r" % (window,))
    if limit is not None and limit < 0:
        raise ValueError("limit must be >= 0, got %r" % (limit,))
    lo, hi = window if window is not None else (-math.inf, math.inf)
    shift = lo if window is not None else 0.0
    comments: List[str] = []
    jobs: List[SWFJob] = []
    examples: List[str] = []
    dropped = {NEVER_RAN: 0, NO_PROCS: 0, OUT_OF_WINDOW: 0}
    lines = malformed = 0
    wanted = limit if limit is not None else -1
    isfinite = math.isfinite
    with _open_text(path) as stream:
        try:
            for line in stream:
                if len(jobs) == wanted:
                    break
                lines += 1
                parts = line.split()
                if not parts:
                    continue
                if parts[0][0] == ";":
                    comments.append(line)
                    continue
                try:
                    v = list(map(float, parts))
                    ok = len(v) == SWF_FIELDS and isfinite(sum(v))
                except ValueError:
                    ok = False
                if not ok:
                    malformed += 1
                    if len(examples) < MAX_EXAMPLES:
                        examples.append("line %d: %s" % (lines, _why_malformed(parts)))
                    continue
                reason = drop_reason(v)
                if reason is None and not lo <= v[1] < hi:
                    reason = OUT_OF_WINDOW
                if reason is not None:
                    dropped[reason] += 1
                    continue
                jobs.append(job_from_fields(v, shift))
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            malformed += 1
            if len(examples) < MAX_EXAMPLES:
                examples.append("line %d: compressed data ends or breaks here (%s)"
                                % (lines + 1, exc))
    jobs.sort(key=attrgetter("submit"))
    header = parse_header(comments)
    if window is not None and header.unix_start_time is not None:
        header = replace(header, unix_start_time=header.unix_start_time + int(round(shift)))
    name = Path(path).name
    report = ReadReport(lines, len(jobs), len(comments), malformed, dropped[NEVER_RAN],
                        dropped[NO_PROCS], dropped[OUT_OF_WINDOW], tuple(examples), name)
    return Trace(name, header, tuple(jobs), report)


def read_sample() -> Trace:
    """The bundled two-week KTH-SP2 window, re-based to start at 0."""
    return read_swf(SAMPLE_PATH, window=SAMPLE_WINDOW)
