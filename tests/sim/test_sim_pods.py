"""The GPU pod-list reader: rows kept and skipped, node lists, the job mapping,
``pbs-power simulate`` on a pod CSV, and the real Alibaba sample when present.

Hand-written CSVs cover each rule; expected numbers are worked out by hand in
the comments.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pbs_power.cli.main import main
from pbs_power.sim.pods import (
    DEFAULT_GPUS_PER_NODE, PodHeader, PodTrace, is_pod_csv, node_list_path, read_node_list,
    read_pods)
from pbs_power.sim.swf import parse_window
from pbs_power.sim.workload import SimJob

TRACES = Path("/work/shared/traces")
REAL_PODS = TRACES / "alibaba-gpu-v2023-openb_pod_list_default.csv.gz"

POD_HEAD = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
            "creation_time,deletion_time,scheduled_time\n")
NODE_HEAD = "sn,cpu_milli,memory_mib,gpu,model\n"


def pod(name, gpus, created, deleted, scheduled="", milli=1000, phase="Running") -> str:
    """One pod row in the Alibaba column order."""
    return "%s,8000,16384,%s,%s,,LS,%s,%s,%s,%s\n" % (name, gpus, milli, phase, created,
                                                      deleted, scheduled)


def node(name, gpus, model="T4") -> str:
    """One node row."""
    return "%s,32000,262144,%s,%s\n" % (name, gpus, model if gpus else "")


def write(path: Path, text: str, gz: bool = False) -> Path:
    """Write `text` to `path`, gzip-compressed when `gz`."""
    data = text.encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


GOOD = [
    pod("p-gpu", 1, 100, 1100, 160, milli=460),    # runs 160..1100: 940 s
    pod("p-cpu", 0, 50, 650),                      # no scheduled_time: 50..650
    pod("p-wide", 16, 200, 200, 200),              # zero length: 1 s
    pod("p-twelve", 12, 300, 4000, 310),
]
BAD = [
    pod("p-backwards", 1, 500, 400, 450),          # deleted before created
    pod("p-never", 1, 10, 800, 900),               # deleted before scheduled
    pod("p-text", 1, "abc", 900, 100),             # malformed: line 8
    "p-cut,8000,16384,1,1000,,LS,Run\n",           # malformed: 8 fields
    pod("p-half", "0.5", 10, 900, 10),             # malformed: num_gpu
    pod("p-nodel", 1, 10, "", 10),                 # malformed: deletion empty
]


def small_trace(tmp_path: Path, nodes: str = "", gz: bool = False) -> Path:
    """The GOOD and BAD rows as `c_pod_list_default.csv[.gz]`, with `nodes` as its node list."""
    suffix = ".csv.gz" if gz else ".csv"
    path = write(tmp_path / ("c_pod_list_default" + suffix), POD_HEAD + "".join(GOOD + BAD), gz)
    if nodes:
        write(tmp_path / ("c_node_list_all_node" + suffix), NODE_HEAD + nodes, gz)
    return path


# -- rows kept and skipped --------------------------------------------------------

def test_every_skip_class_is_counted_and_summarised(tmp_path):
    trace = read_pods(small_trace(tmp_path))
    report = trace.report
    assert (report.rows, report.pods, report.jobs, report.unscheduled) == (10, 4, 4, 1)
    assert (report.dropped_deleted_before_created, report.dropped_deleted_before_scheduled,
            report.dropped_out_of_window, report.malformed) == (1, 1, 0, 4)
    assert report.first_malformed == (
        "line 8: creation_time is not a number: 'abc'",
        "line 9: 8 fields, need 11",
        "line 10: num_gpu is not a whole number >= 0: '0.5'",
        "line 11: deletion_time is empty")
    assert report.summary() == (
        "c_pod_list_default.csv: 4 pods (1 without scheduled_time run from creation); "
        "skipped 1 deleted before created, 1 deleted before scheduled, "
        "4 malformed (line 8: creation_time is not a number: 'abc', ...)")


def test_pods_keep_their_times_sorted_by_creation(tmp_path):
    trace = read_pods(small_trace(tmp_path))
    assert isinstance(trace, PodTrace) and trace.name == "c_pod_list_default.csv"
    assert [(p.name, p.creation, p.scheduled, p.deletion, p.num_gpu, p.start)
            for p in trace.pods] == [
        ("p-cpu", 50.0, None, 650.0, 0, 50.0),
        ("p-gpu", 100.0, 160.0, 1100.0, 1, 160.0),
        ("p-wide", 200.0, 200.0, 200.0, 16, 200.0),
        ("p-twelve", 300.0, 310.0, 4000.0, 12, 310.0)]
    assert trace.pods[1].gpu_milli == 460 and trace.pods[1].phase == "Running"


def test_window_keeps_half_open_range_and_rebases(tmp_path):
    trace = read_pods(small_trace(tmp_path), window=(100.0, 300.0))
    assert [(p.name, p.creation, p.scheduled, p.deletion) for p in trace.pods] == [
        ("p-gpu", 0.0, 60.0, 1000.0), ("p-wide", 100.0, 100.0, 100.0)]
    assert trace.report.dropped_out_of_window == 2
    assert "2 outside the window" in trace.report.summary()
    with pytest.raises(ValueError, match="window end"):
        read_pods(small_trace(tmp_path), window=(5.0, 5.0))


def test_gzip_by_content_truncation_and_non_utf8_never_crash(tmp_path):
    rows = "".join(pod("p%d" % i, 1, i, i + 60, i) for i in range(3000))
    packed = gzip.compress((POD_HEAD + rows).encode())
    cut = tmp_path / "cut_pod_list_x.csv"   # gzip although the name says plain
    cut.write_bytes(packed[:len(packed) // 2])
    trace = read_pods(cut)
    assert 100 < trace.report.pods < 3000
    assert trace.report.malformed >= 1
    assert "compressed data ends or breaks here" in trace.report.first_malformed[-1]
    odd = tmp_path / "odd.csv"
    odd.write_bytes((POD_HEAD + pod("a", 1, 0, 10, 0)).encode()
                    + pod("b", 1, 0, 10, 0).encode().replace(b",10,", b",1\xff0,")
                    + b"\0\0\0\n")
    trace = read_pods(odd)
    assert [p.name for p in trace.pods] == ["a"] and trace.report.malformed == 2
    assert trace.report.first_malformed[0] == "line 3: deletion_time is not a number: '1\ufffd0'"


def test_missing_columns_or_empty_file(tmp_path):
    with pytest.raises(ValueError, match="no deletion_time, num_gpu column"):
        read_pods(write(tmp_path / "a.csv", "name,creation_time\nx,1\n"))
    empty = read_pods(write(tmp_path / "b.csv", ""))
    assert empty.pods == () and empty.report.summary() == "b.csv: 0 pods; nothing skipped"


# -- node list ----------------------------------------------------------------------

NODES = (node("c1", 0) + node("c2", 0) + node("g1", 4) + node("g2", 4) + node("g3", 4)
         + node("g4", 8, "V100") + node("g5", 8, "V100") + "g6,32000,262144,many,T4\n")


def test_node_list_is_found_next_to_the_pod_list(tmp_path):
    for gz in (False, True):
        path = small_trace(tmp_path, NODES, gz=gz)
        suffix = ".csv.gz" if gz else ".csv"
        assert node_list_path(path) == tmp_path / ("c_node_list_all_node" + suffix)
        header = read_pods(path).header
        # 7 good rows (g6 has no GPU count); 4 GPUs on 3 nodes beats 8 GPUs on 2
        assert header == PodHeader(max_nodes=7, gpus_per_node=4, gpu_nodes=5, gpus=28,
                                   node_list="c_node_list_all_node" + suffix,
                                   node_list_malformed=1)
    assert node_list_path(tmp_path / "other_pod_list_gpuspec33.csv") is None   # not there
    assert node_list_path(write(tmp_path / "jobs.csv", POD_HEAD)) is None      # no pod_list_


def test_without_a_node_list_size_is_unknown_and_gpus_default(tmp_path):
    header = read_pods(small_trace(tmp_path)).header
    assert header == PodHeader() and header.max_nodes is None
    assert header.gpus_per_node == DEFAULT_GPUS_PER_NODE == 8


def test_node_list_ties_and_cpu_only(tmp_path):
    tie = read_node_list(write(tmp_path / "t.csv", NODE_HEAD + node("a", 2) + node("b", 8)))
    assert (tie.max_nodes, tie.gpus_per_node) == (2, 8)
    cpu = read_node_list(write(tmp_path / "u.csv", NODE_HEAD + node("a", 0)))
    assert (cpu.max_nodes, cpu.gpus_per_node, cpu.gpu_nodes) == (1, 8, 0)


def test_is_pod_csv_by_name():
    assert is_pod_csv("a/b_pod_list_default.csv.gz") and is_pod_csv("x.CSV")
    assert not is_pod_csv("KTH-SP2-1996-2.1-cln.swf.gz") and not is_pod_csv("x.csv.bak")


# -- to the simulator ---------------------------------------------------------------

def test_sim_jobs_map_gpus_to_whole_nodes(tmp_path):
    trace = read_pods(small_trace(tmp_path, NODES))
    sims = trace.sim_jobs(start=1000.0)       # header: 4 GPUs per node, 7 nodes
    assert all(isinstance(s, SimJob) for s in sims)
    assert [(s.id, s.submit, s.nodes, s.runtime, s.walltime) for s in sims] == [
        ("p-cpu", 1050.0, 1, 600.0, 600.0),      # CPU-only: one node, from creation
        ("p-gpu", 1100.0, 1, 940.0, 940.0),      # 1100 - 160
        ("p-wide", 1200.0, 4, 1.0, 1.0),         # ceil(16 / 4); zero length -> 1 s
        ("p-twelve", 1300.0, 3, 3690.0, 3690.0)]  # ceil(12 / 4); 4000 - 310
    assert [s.nodes for s in trace.sim_jobs(cores_per_node=8)] == [1, 1, 2, 2]
    assert [s.nodes for s in trace.sim_jobs(nodes=2)] == [1, 1, 2, 2]
    with pytest.raises(ValueError, match="GPUs per node"):
        trace.sim_jobs(cores_per_node=0)


def test_cli_prints_the_table_for_a_pod_csv(tmp_path, capsys):
    path = small_trace(tmp_path, NODES)
    assert main(["simulate", "--trace", str(path), "--node-type", "gpu"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith("c_pod_list_default.csv: 4 jobs, 7 nodes,")
    assert lines[1].split()[:3] == ["manager", "energy", "kWh"]
    assert [line.split()[0] for line in lines[3:]] == ["always-on", "pbs-power", "slurm",
                                                       "openpbs"]
    assert "c_pod_list_default.csv: 4 pods (1 without scheduled_time" in err
    assert "simulating 4 jobs on 7 nodes (4 GPUs per node)" in err


def test_cli_pod_energy_by_hand_and_nodes_option(tmp_path, capsys):
    # 2 nodes of 8 GPUs: a 1-GPU pod runs 0..3600; a 16-GPU pod created at 0
    # wants both nodes for 1800 s, so it waits: 3600..5400. Idle 200 W, busy
    # 400 W: (400 + 200) * 3600 + 800 * 1800 J = 1.0 kWh.
    path = write(tmp_path / "e_pod_list_default.csv",
                 POD_HEAD + pod("one", 1, 0, 3600, 0) + pod("wide", 16, 0, 1800))
    config = tmp_path / "hook.json"
    config.write_text(json.dumps({"power_on_off_enable": True,
                                  "node_power": {"busy_watts": 400, "idle_watts": 200}}))
    argv = ["simulate", "--trace", str(path), "--config", str(config),
            "--managers", "always-on", "--node-type", "gpu", "--json"]
    assert main(argv) == 2
    assert "e_pod_list_default.csv has no node list next to it: give --nodes" in \
        capsys.readouterr().err
    assert main(argv + ["--nodes", "2"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert (doc["jobs"], doc["nodes"]) == (2, 2)
    assert doc["managers"]["always-on"]["energy_kwh"] == 1.0
    assert "(8 GPUs per node)" in err


# -- the real sample ------------------------------------------------------------------

def test_real_alibaba_pod_list_matches_its_readme():
    if not REAL_PODS.is_file():
        pytest.skip("%s is absent (the shared traces folder is not on this machine)" % REAL_PODS)
    trace = read_pods(REAL_PODS)
    report = trace.report
    # /work/shared/traces/README.md: 8,152 pods, deletion >= creation for all,
    # scheduled_time present for 89.0%; node list 1,523 nodes, 6,212 GPUs, 310 CPU-only.
    assert (report.rows, report.pods, report.malformed) == (8152, 8152, 0)
    assert report.dropped_deleted_before_created == 0
    assert round(100.0 * (1 - report.unscheduled / report.pods), 1) == 89.0
    header = trace.header
    assert (header.max_nodes, header.gpus, header.gpu_nodes) == (1523, 6212, 1523 - 310)
    assert header.gpus_per_node == 8
    counts = {}
    for p in trace.pods:
        counts[p.num_gpu] = counts.get(p.num_gpu, 0) + 1
    assert counts == {1: 6989, 0: 1088, 8: 44, 2: 16, 4: 15}
    assert trace.pods[-1].creation == 12901761.0
    sims = trace.sim_jobs()
    assert len(sims) == 8152 and all(s.nodes == 1 and s.walltime == s.runtime >= 1
                                     for s in sims)
    assert read_pods(REAL_PODS, window=parse_window("0:30d")).report.pods == 3
