"""The SWF reader: header, drop and malformed classes, windows, gzip, and real traces.

Hand-written traces cover each rule; the bundled KTH-SP2 window and the first
2,000 jobs of each real trace in /work/shared/traces check it on real logs.
"""
from __future__ import annotations

import dataclasses
import gzip
from pathlib import Path

import pytest

from pbs_power.sim.swf import (
    SAMPLE_PATH, SAMPLE_WINDOW, ReadReport, SWFHeader, SWFJob, Trace, parse_header,
    parse_window, read_sample, read_swf)
from pbs_power.sim.workload import SimJob

TRACES = Path("/work/shared/traces")

HEADER = """\
; Version: 2.2
; Computer: IBM SP2
; Installation: Cornell Theory Center (CTC)
; Acknowledge: Dan Dwyer and Steve Hotovy
; Information: http://www.tc.cornell.edu/
;              http://www.cs.huji.ac.il/labs/parallel/workload/
; UnixStartTime: 835823160
; TimeZone: -18000
; TimeZoneString: US/Eastern
; MaxNodes: 338 (batch partition; 512 total)
; MaxProcs: 338
; Note: uses the EASY scheduler
;
; Note: THIS IS A CLEANED VERSION OF THE LOG!
;       The filter used to produce it was
;         job<=14 (14 jobs removed)
;
"""


def job(job_id=1, submit=0, wait=10, run=100, alloc=4, req=4, req_time=3600, status=1,
        user=7, queue=2, partition=3) -> str:
    """One SWF job line with the 18 fields; the unused ones are -1."""
    fields = [job_id, submit, wait, run, alloc, -1, -1, req, req_time, -1, status, user,
              user, -1, queue, partition, -1, -1]
    return " ".join("%6s" % f for f in fields) + "\n"


def write(tmp_path: Path, text, name: str = "t.swf", gz: bool = False) -> Path:
    """Write a trace (str or bytes), gzip-compressed when `gz`."""
    data = text.encode() if isinstance(text, str) else text
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


# -- header ------------------------------------------------------------------

def test_header_fields_leading_integers_and_notes(tmp_path):
    trace = read_swf(write(tmp_path, HEADER + job()))
    header = trace.header
    assert header.max_nodes == 338 and header.max_procs == 338
    assert header.unix_start_time == 835823160
    assert header.time_zone_string == "US/Eastern"
    assert header.installation == "Cornell Theory Center (CTC)"
    assert header.computer == "IBM SP2"
    assert header.notes == (
        "uses the EASY scheduler",
        "THIS IS A CLEANED VERSION OF THE LOG! The filter used to produce it was "
        "job<=14 (14 jobs removed)")
    assert trace.report.comments == HEADER.count("\n")


def test_header_missing_or_unusable_fields_are_none():
    header = parse_header(["; Version: 2.2\n", "; MaxNodes: -1\n", "; MaxProcs: many\n",
                           ";\tsee: http://example.org\n"])
    assert header == SWFHeader()


# -- what is kept, dropped and malformed -------------------------------------

def test_every_drop_and_malformed_class_is_counted_and_summarised(tmp_path):
    lines = [
        HEADER,
        job(1, submit=0),
        "\n",
        "   \n",
        job(2, submit=5, run=-1, alloc=-1, req=8, status=5),  # cancelled, never started
        job(3, submit=6, run=0, alloc=0, req=-1, status=5),   # never ran, no procs either
        job(4, submit=-1, wait=-1, run=-1, alloc=-1, req=-1, req_time=-1),  # placeholder
        job(5, submit=7, run=50, alloc=-1, req=-1),            # ran on no processors
        job(6, submit=8).rsplit(None, 1)[0] + "\n",            # 17 fields
        job(7, submit=9).replace("  100 ", " 1o0 ", 1),        # not a number
        job(8, submit=10, run="nan"),                          # not finite
        job(9, submit=11),
    ]
    trace = read_swf(write(tmp_path, "".join(lines), name="mixed.swf"))
    report = trace.report
    assert [j.job_id for j in trace.jobs] == [1, 9]
    assert (report.jobs, report.malformed, report.dropped_never_ran,
            report.dropped_no_procs, report.dropped_out_of_window) == (2, 3, 3, 1, 0)
    first = HEADER.count("\n") + 1
    assert report.lines == first + 11 - 1
    assert report.first_malformed == (
        "line %d: 17 fields, need 18" % (first + 7),
        "line %d: field 4 is not a number: '1o0'" % (first + 8),
        "line %d: field 4 is not a number: 'nan'" % (first + 9))
    assert report.summary() == (
        "mixed.swf: 2 jobs; skipped 3 never ran, 1 without processors, "
        "3 malformed (line %d: 17 fields, need 18, ...)" % (first + 7))


def test_summary_of_a_clean_trace_and_thousands_separators():
    report = ReadReport(
        lines=1300, jobs=1234, comments=3, malformed=0, dropped_never_ran=5669,
        dropped_no_procs=0, dropped_out_of_window=0, first_malformed=(), source="x.swf")
    assert report.summary() == "x.swf: 1,234 jobs; skipped 5,669 never ran"
    assert dataclasses.replace(report, dropped_never_ran=0).summary() == (
        "x.swf: 1,234 jobs; nothing skipped")


def test_only_five_malformed_examples_are_kept(tmp_path):
    trace = read_swf(write(tmp_path, "garbage\n" * 8 + job()))
    assert trace.report.malformed == 8 and len(trace.report.first_malformed) == 5
    assert trace.report.first_malformed[0] == "line 1: 1 fields, need 18"
    assert len(trace.jobs) == 1


def test_processors_fall_back_from_allocated_to_requested(tmp_path):
    text = job(1, alloc=16, req=32) + job(2, alloc=-1, req=8) + job(3, alloc=6, req=-1)
    jobs = read_swf(write(tmp_path, text)).jobs
    assert [(j.procs, j.requested_procs) for j in jobs] == [(16, 32), (8, 8), (6, None)]


def test_unknown_times_become_none_or_zero(tmp_path):
    text = (job(1, wait=-1, req_time=-1) + job(2, wait=0, req_time=0)
            + job(3, wait=30, req_time=600) + job(4, run=-1, alloc=2))
    jobs = read_swf(write(tmp_path, text)).jobs
    assert [(j.wait, j.requested_time) for j in jobs] == [
        (None, None), (0.0, None), (30.0, 600.0), (10.0, 3600.0)]
    assert jobs[3].run_time == 0.0
    assert jobs[2] == SWFJob(3, 0.0, 30.0, 100.0, 4, 4, 600.0, 1, 7, 2, 3)


def test_jobs_are_sorted_by_submit_and_ties_keep_file_order(tmp_path):
    text = job(1, submit=50) + job(2, submit=10) + job(3, submit=50) + job(4, submit=10)
    assert [j.job_id for j in read_swf(write(tmp_path, text)).jobs] == [2, 4, 1, 3]


def test_limit_stops_after_that_many_kept_jobs(tmp_path):
    text = job(1) + job(2, run=-1, alloc=-1) + job(3) + job(4) + job(5)
    trace = read_swf(write(tmp_path, text), limit=2)
    assert [j.job_id for j in trace.jobs] == [1, 3]
    assert trace.report.lines == 3
    assert read_swf(write(tmp_path, text), limit=0).jobs == ()
    with pytest.raises(ValueError, match="limit"):
        read_swf(write(tmp_path, text), limit=-1)


# -- windows -------------------------------------------------------------------

def test_window_keeps_half_open_range_and_rebases(tmp_path):
    text = HEADER + "".join(job(i, submit=s) for i, s in enumerate((0, 99, 100, 150, 199.5, 200)))
    trace = read_swf(write(tmp_path, text), window=(100.0, 200.0))
    assert [(j.job_id, j.submit) for j in trace.jobs] == [(2, 0.0), (3, 50.0), (4, 99.5)]
    assert trace.report.dropped_out_of_window == 3
    assert trace.header.unix_start_time == 835823160 + 100
    assert "3 outside the window" in trace.report.summary()
    with pytest.raises(ValueError, match="after its start"):
        read_swf(write(tmp_path, text), window=(5.0, 5.0))


@pytest.mark.parametrize("text, expected", [
    ("0:86400", (0.0, 86400.0)),
    ("2d:9d", (172800.0, 777600.0)),
    ("36h:48h", (129600.0, 172800.0)),
    ("90m:2h", (5400.0, 7200.0)),
    (" 10s : 1.5D ", (10.0, 129600.0)),
    ("0.5h:3600", (1800.0, 3600.0)),
])
def test_parse_window_formats(text, expected):
    assert parse_window(text) == expected


@pytest.mark.parametrize("text, message", [
    ("", "expected START:END"),
    ("86400", "expected START:END"),
    ("1:2:3", "expected START:END"),
    ("a:5", "START 'a' is not a number"),
    ("5:2w", "END '2w' is not a number"),
    ("-1d:2d", "START '-1d' is not a number"),
    (":5", "START '' is not a number"),
    ("2d:1d", "END must be after START"),
    ("1h:3600", "END must be after START"),
])
def test_parse_window_errors_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        parse_window(text)


# -- bytes on disk ----------------------------------------------------------------

def test_gzip_is_detected_by_magic_bytes_not_name(tmp_path):
    packed = read_swf(write(tmp_path, HEADER + job(), name="looks-plain.swf", gz=True))
    plain = read_swf(write(tmp_path, HEADER + job(), name="looks-packed.swf.gz"))
    assert packed.jobs == plain.jobs and len(plain.jobs) == 1
    assert packed.header == plain.header and packed.name == "looks-plain.swf"


def test_non_utf8_bytes_make_a_line_malformed_not_a_crash(tmp_path):
    data = (b"; Installation: Caf\xe9 cluster\n" + job(1).encode()
            + job(2).encode().replace(b" 100 ", b" 1\xff0 ", 1) + job(3).encode())
    trace = read_swf(write(tmp_path, data, gz=True))
    assert [j.job_id for j in trace.jobs] == [1, 3]
    assert trace.header.installation == "Caf\ufffd cluster"
    assert trace.report.first_malformed == ("line 3: field 4 is not a number: '1\ufffd0'",)


def test_truncated_last_line_is_malformed(tmp_path):
    text = job(1) + job(2)[:30]
    trace = read_swf(write(tmp_path, text))
    assert [j.job_id for j in trace.jobs] == [1]
    assert trace.report.first_malformed == ("line 2: 4 fields, need 18",)
    whole = read_swf(write(tmp_path, job(1) + job(2).rstrip("\n")))
    assert [j.job_id for j in whole.jobs] == [1, 2] and whole.report.malformed == 0


def test_truncated_gzip_stream_keeps_what_was_read(tmp_path):
    packed = gzip.compress(("".join(job(i, submit=i) for i in range(1, 3001))).encode())
    trace = read_swf(write(tmp_path, packed[:len(packed) // 2], name="cut.swf.gz"))
    assert trace.report.malformed >= 1
    assert "compressed data ends" in trace.report.first_malformed[-1]
    assert len(trace.jobs) > 100


# -- to the simulator -------------------------------------------------------------

def test_sim_jobs_map_processors_to_nodes_with_a_cap(tmp_path):
    text = HEADER.replace("338 (batch", "10 (batch") + "".join([
        job(1, submit=5, alloc=1, run=0, req_time=-1),
        job(2, submit=6, alloc=5, run=100, req_time=50),
        job(3, submit=7, alloc=8, run=100, req_time=900),
        job(4, submit=8, alloc=400, run=100, req_time=-1),
    ])
    trace = read_swf(write(tmp_path, text))
    sims = trace.sim_jobs(cores_per_node=4, start=1000.0)
    assert all(isinstance(s, SimJob) for s in sims)
    assert [(s.id, s.submit, s.nodes, s.runtime, s.walltime) for s in sims] == [
        ("1", 1005.0, 1, 1.0, 1.0),
        ("2", 1006.0, 2, 100.0, 100.0),   # request shorter than the run: the run
        ("3", 1007.0, 2, 100.0, 900.0),
        ("4", 1008.0, 10, 100.0, 100.0),  # 100 nodes wanted, header MaxNodes 10
    ]
    assert [s.nodes for s in trace.sim_jobs(nodes=6)] == [1, 5, 6, 6]
    uncapped = dataclasses.replace(trace, header=SWFHeader())
    assert [s.nodes for s in uncapped.sim_jobs()] == [1, 5, 8, 400]
    with pytest.raises(ValueError, match="cores_per_node"):
        trace.sim_jobs(cores_per_node=0)


# -- real logs ----------------------------------------------------------------------

def test_bundled_sample_is_a_real_two_week_window():
    assert SAMPLE_PATH.read_bytes()[:2] == b"\x1f\x8b"
    assert (SAMPLE_PATH.parent / "README.md").is_file()
    trace = read_sample()
    assert isinstance(trace, Trace) and trace.name == "kth-sp2-window.swf.gz"
    assert trace.report.summary() == "kth-sp2-window.swf.gz: 927 jobs; nothing skipped"
    assert trace.header.max_nodes == 100 and trace.header.max_procs == 100
    assert trace.header.unix_start_time == 843480031 + int(SAMPLE_WINDOW[0])
    assert trace.header.time_zone_string == "Europe/Stockholm"
    assert any("WINDOW" in note and "4791569" in note for note in trace.header.notes)
    assert any("Feitelson" in note and "Malinowsky" in note for note in trace.header.notes)
    assert 0 <= trace.jobs[0].submit and trace.jobs[-1].submit < 14 * 86400
    whole = read_swf(SAMPLE_PATH)
    assert whole.jobs[0].submit >= SAMPLE_WINDOW[0] and whole.report.jobs == 927
    sims = trace.sim_jobs()
    assert len(sims) == 927 and max(s.nodes for s in sims) <= 100
    assert all(s.walltime >= s.runtime >= 1 for s in sims)


REAL = [  # file, MaxNodes, MaxProcs, TimeZoneString: from /work/shared/traces/README.md
    ("KTH-SP2-1996-2.1-cln.swf.gz", 100, 100, "Europe/Stockholm"),
    ("SDSC-SP2-1998-4.2-cln.swf.gz", 128, 128, "US/Pacific"),
    ("CTC-SP2-1996-3.1-cln.swf.gz", 338, 338, "US/Eastern"),
    ("LLNL-Thunder-2007-1.1-cln.swf.gz", 1002, 4008, "US/Pacific"),
    ("LLNL-Atlas-2006-2.1-cln.swf.gz", 1152, 9216, "US/Pacific"),
    ("CEA-Curie-2011-2.1-cln.swf.gz", 5544, 93312, "Europe/Paris"),
]


@pytest.mark.parametrize("name, max_nodes, max_procs, zone", REAL, ids=[r[0] for r in REAL])
def test_real_trace_first_jobs_and_header(name, max_nodes, max_procs, zone):
    path = TRACES / name
    if not path.is_file():
        pytest.skip("%s is absent (the shared traces folder is not on this machine)" % path)
    trace = read_swf(path, limit=2000)
    assert (trace.header.max_nodes, trace.header.max_procs) == (max_nodes, max_procs)
    assert trace.header.time_zone_string == zone
    assert trace.report.jobs == len(trace.jobs) == 2000
    assert trace.report.malformed == 0
    assert all(j.procs > 0 and j.run_time >= 0 and j.submit >= 0 for j in trace.jobs)
    assert max(j.procs for j in trace.jobs) <= max_procs
    assert list(trace.jobs) == sorted(trace.jobs, key=lambda j: j.submit)
