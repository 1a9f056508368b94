"""Read a GPU-cluster pod trace (CSV) for the simulator, as `swf.py` reads SWF logs.

The input is a Kubernetes pod list such as Alibaba's GPU-cluster trace
(cluster-trace-gpu-v2023, `openb_pod_list_*.csv`; Weng et al., "Beware of
Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient
Descent", USENIX ATC 2023): a header row, then one pod per row with
`creation_time`, `scheduled_time`, `deletion_time` (seconds, relative),
`num_gpu`, `gpu_milli`, `pod_phase`, ... Plain or gzip, told apart by content.

Mapping onto the simulator's whole-node batch jobs (a simplification):

- one pod is one job, submitted at `creation_time`;
- it runs from `scheduled_time` (from `creation_time` when that is empty) to
  `deletion_time`: run time = deletion - start (at least 1 s);
- it needs `max(1, ceil(num_gpu / gpus_per_node))` whole nodes; CPU-only pods
  take one node. The real cluster shares GPUs and packs several pods on a
  node (`gpu_milli` < 1000 is a fraction of a GPU), so the replay holds far
  more node time than the real pods did;
- the requested walltime is not in the trace: it is taken equal to the run
  time, a perfect estimate that makes backfilling better than real;
- pods deleted before they were created, or before they were scheduled, never
  ran: they are skipped and counted.

The cluster size comes from the node list next to the pod list (same folder,
`pod_list_*` in the name replaced by `node_list_all_node`) when there is one:
every node counts, and `gpus_per_node` is the most common GPU count among its
GPU nodes (8 without a node list). Bad or truncated rows are counted and
skipped with a few `"line N: why"` examples, never fatal; only a missing file,
a file without the needed columns, or bad arguments raise.
"""
from __future__ import annotations

import csv
import gzip
import math
import re
import zlib
from collections import Counter
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import IO, Dict, Iterator, List, Optional, Tuple

from .swf import GZIP_MAGIC, MAX_EXAMPLES, PathLike, node_cap, summary_line
from .workload import SimJob

#: GPUs per node assumed when there is no node list (or it has no GPU node).
DEFAULT_GPUS_PER_NODE = 8
#: Columns a pod list must have; `scheduled_time`, `name`, `gpu_milli` are optional.
POD_COLUMNS = ("creation_time", "deletion_time", "num_gpu")
#: Columns a node list must have.
NODE_COLUMNS = ("gpu",)
_POD_LIST = re.compile(r"pod_list_[^.]*")
_CSV_NAME = re.compile(r"\.csv(\.gz)?$", re.IGNORECASE)


@dataclass(frozen=True)
class PodHeader:
    """What is known of the cluster: its size and GPUs per node, and where from.

    `max_nodes` counts every node of the node list (None without one);
    `gpu_nodes` and `gpus` are that list's GPU nodes and GPUs; `node_list`
    names the file they came from ("" when none was found).
    """

    max_nodes: Optional[int] = None
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    gpu_nodes: int = 0
    gpus: int = 0
    node_list: str = ""
    node_list_malformed: int = 0


@dataclass(frozen=True)
class Pod:
    """One pod as logged; `scheduled` is None when the trace has no scheduled_time."""

    name: str
    creation: float
    scheduled: Optional[float]
    deletion: float
    num_gpu: int
    gpu_milli: Optional[int] = None
    phase: str = ""

    @property
    def start(self) -> float:
        """When it began to run: scheduled, else created."""
        return self.creation if self.scheduled is None else self.scheduled


@dataclass(frozen=True)
class PodReport:
    """Counts of what `read_pods` read and skipped, in the style of `swf.ReadReport`.

    `rows` counts data rows read, `pods` the pods kept, `unscheduled` the kept
    pods without scheduled_time; each `dropped_*` counts valid rows left out,
    and `malformed` the rows that could not be read (`first_malformed` keeps up
    to five `"line N: why"` examples). `source` names the file.
    """

    rows: int
    pods: int
    unscheduled: int
    malformed: int
    dropped_deleted_before_created: int
    dropped_deleted_before_scheduled: int
    dropped_out_of_window: int
    first_malformed: Tuple[str, ...]
    source: str = ""

    @property
    def jobs(self) -> int:
        """Pods kept: each is one simulated job."""
        return self.pods

    def summary(self) -> str:
        """One line: pods kept, then each non-empty class of skipped rows."""
        head = "%s: %s pods" % (self.source or "trace", format(self.pods, ","))
        if self.unscheduled:
            head += " (%s without scheduled_time run from creation)" % format(self.unscheduled, ",")
        return summary_line(head, ((self.dropped_deleted_before_created, "deleted before created"),
                                   (self.dropped_deleted_before_scheduled,
                                    "deleted before scheduled"),
                                   (self.dropped_out_of_window, "outside the window")),
                            self.malformed, self.first_malformed)


@dataclass(frozen=True)
class PodTrace:
    """A read pod list: its name, cluster header, kept pods (sorted by creation) and report."""

    name: str
    header: PodHeader
    pods: Tuple[Pod, ...]
    report: PodReport

    def sim_jobs(self, cores_per_node: Optional[int] = None, nodes: Optional[int] = None,
                 start: float = 0.0) -> List[SimJob]:
        """The pods as whole-node `SimJob`s, submitted at `start + creation`.

        `cores_per_node` is GPUs per node here (default: the header's); a pod
        needs `max(1, ceil(num_gpu / cores_per_node))` nodes, capped at `nodes`
        (default: the header's max_nodes). Walltime equals the run time.
        """
        per_node = self.header.gpus_per_node if cores_per_node is None else cores_per_node
        if per_node < 1:
            raise ValueError("cores_per_node (GPUs per node) must be >= 1, got %r" % (per_node,))
        cap = node_cap(nodes, self.header.max_nodes)
        out = []
        for pod in self.pods:
            width = min(max(1, -(-pod.num_gpu // per_node)), cap)
            runtime = max(1.0, pod.deletion - pod.start)
            out.append(SimJob(pod.name, start + pod.creation, width, runtime, runtime))
        return out


def is_pod_csv(path: PathLike) -> bool:
    """True for a `.csv` or `.csv.gz` file name: read it as a pod list, not SWF."""
    return bool(_CSV_NAME.search(Path(path).name))


def node_list_path(pod_path: PathLike) -> Optional[Path]:
    """The node list next to a pod list (`pod_list_*` -> `node_list_all_node`), if it exists."""
    path = Path(pod_path)
    name = _POD_LIST.sub("node_list_all_node", path.name, count=1)
    if name == path.name:
        return None
    candidate = path.with_name(name)
    return candidate if candidate.is_file() else None


def _open_text(path: PathLike) -> IO[str]:
    """Open `path` as CSV text, gunzipping when it starts with the gzip magic bytes."""
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == GZIP_MAGIC:
        return gzip.open(path, "rt", encoding="utf-8", errors="replace", newline="")
    return open(path, "r", encoding="utf-8", errors="replace", newline="")


class _Rows:
    """CSV data rows as `(line, fields or None, why)`: bad rows say why, never raise."""

    def __init__(self, stream: IO[str]):
        self._reader = csv.reader(stream)
        self.columns: Dict[str, int] = {}
        self.width = 0

    def header(self, path: PathLike, needed: Tuple[str, ...]) -> bool:
        """Read the header row; False for an empty file, ValueError when columns are missing."""
        for line, row, _ in self:
            if row is None:
                continue
            self.columns = {name.strip().lstrip("\ufeff"): i for i, name in enumerate(row)}
            self.width = len(row)
            missing = [c for c in needed if c not in self.columns]
            if missing:
                raise ValueError("%s: no %s column in the header row (line %d)"
                                 % (Path(path).name, ", ".join(missing), line))
            return True
        return False

    def __iter__(self) -> Iterator[Tuple[int, Optional[List[str]], str]]:
        reader = self._reader
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                yield reader.line_num, None, "not CSV (%s)" % (exc,)
                continue
            except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
                yield reader.line_num + 1, None, "compressed data ends or breaks here (%s)" % (exc,)
                return
            if row:
                yield reader.line_num, row, ""


def _number(row: List[str], columns: Dict[str, int], name: str,
            optional: bool = False) -> Optional[float]:
    """A finite number from column `name`; None when empty and optional; ValueError says why."""
    text = row[columns[name]].strip() if name in columns else ""
    if not text:
        if optional:
            return None
        raise ValueError("%s is empty" % name)
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError("%s is not a number: %r" % (name, text[:20]))
    return value


def _count(row: List[str], columns: Dict[str, int], name: str) -> int:
    """A whole number >= 0 from column `name` (num_gpu); ValueError says why."""
    value = _number(row, columns, name)
    if value is None or value < 0 or value != int(value):
        raise ValueError("%s is not a whole number >= 0: %r" % (name, row[columns[name]][:20]))
    return int(value)


def _pod(row: List[str], columns: Dict[str, int], width: int, line: int) -> Pod:
    """The `Pod` of one data row of `width` fields; ValueError says what is wrong with it."""
    if len(row) != width:
        raise ValueError("%d fields, need %d" % (len(row), width))
    try:
        milli = _count(row, columns, "gpu_milli") if "gpu_milli" in columns else None
    except ValueError:
        milli = None  # informational only: the mapping does not use it
    name_at = columns.get("name")
    name = row[name_at].strip() if name_at is not None else ""
    phase_at = columns.get("pod_phase")
    return Pod(name or "line-%d" % line, _number(row, columns, "creation_time"),
               _number(row, columns, "scheduled_time", optional=True),
               _number(row, columns, "deletion_time"), _count(row, columns, "num_gpu"),
               milli, row[phase_at].strip() if phase_at is not None else "")


def read_node_list(path: PathLike) -> PodHeader:
    """The cluster size and typical GPUs per node from a node list CSV (`sn, ..., gpu, model`)."""
    gpu_counts: List[int] = []
    malformed = 0
    with _open_text(path) as stream:
        rows = _Rows(stream)
        if rows.header(path, NODE_COLUMNS):
            for _, row, _ in rows:
                try:
                    if row is None or len(row) != rows.width:
                        raise ValueError
                    gpu_counts.append(_count(row, rows.columns, "gpu"))
                except ValueError:
                    malformed += 1
    with_gpus = Counter(g for g in gpu_counts if g > 0)
    typical = max(with_gpus.items(), key=lambda kv: (kv[1], kv[0]))[0] if with_gpus else \
        DEFAULT_GPUS_PER_NODE
    return PodHeader(max_nodes=len(gpu_counts) or None, gpus_per_node=typical,
                     gpu_nodes=sum(with_gpus.values()), gpus=sum(gpu_counts),
                     node_list=Path(path).name, node_list_malformed=malformed)


def read_pods(path: PathLike, window: Optional[Tuple[float, float]] = None,
              node_list: Optional[PathLike] = None) -> PodTrace:
    """Read a pod list CSV (plain or gzip) into a `PodTrace`.

    `window=(start, end)` keeps pods created in `[start, end)` seconds and
    re-bases their times so the window starts at 0. `node_list` names the node
    list to size the cluster from (default: the one next to `path`, if any).
    """
    if window is not None and not window[1] > window[0]:
        raise ValueError("window end must be after its start, got %r" % (window,))
    lo, hi = window if window is not None else (-math.inf, math.inf)
    shift = lo if window is not None else 0.0
    nodes_file = Path(node_list) if node_list is not None else node_list_path(path)
    header = read_node_list(nodes_file) if nodes_file is not None else PodHeader()
    pods: List[Pod] = []
    examples: List[str] = []
    dropped = Counter()
    rows = malformed = 0
    with _open_text(path) as stream:
        reader = _Rows(stream)
        if reader.header(path, POD_COLUMNS):
            for line, row, why in reader:
                rows += 1
                pod = None
                if row is not None:
                    try:
                        pod = _pod(row, reader.columns, reader.width, line)
                    except ValueError as exc:
                        why = str(exc)
                if pod is None:
                    malformed += 1
                    if len(examples) < MAX_EXAMPLES:
                        examples.append("line %d: %s" % (line, why))
                    continue
                reason = _drop_reason(pod, lo, hi)
                if reason:
                    dropped[reason] += 1
                    continue
                pods.append(_shifted(pod, shift))
    pods.sort(key=attrgetter("creation"))
    name = Path(path).name
    report = PodReport(rows, len(pods), sum(1 for p in pods if p.scheduled is None), malformed,
                       dropped["created"], dropped["scheduled"], dropped["window"],
                       tuple(examples), name)
    return PodTrace(name, header, tuple(pods), report)


def _drop_reason(pod: Pod, lo: float, hi: float) -> str:
    """Why a well-formed pod is not replayed ("" to keep it)."""
    if pod.deletion < pod.creation:
        return "created"
    if pod.scheduled is not None and pod.deletion < pod.scheduled:
        return "scheduled"
    if not lo <= pod.creation < hi:
        return "window"
    return ""


def _shifted(pod: Pod, shift: float) -> Pod:
    """`pod` with its times moved back by `shift` seconds (the window start)."""
    if not shift:
        return pod
    return Pod(pod.name, pod.creation - shift,
               None if pod.scheduled is None else pod.scheduled - shift,
               pod.deletion - shift, pod.num_gpu, pod.gpu_milli, pod.phase)
