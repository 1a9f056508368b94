"""The hook's forecast: when each queued job starts, from running jobs' walltimes
and the vnodes' room, EASY-style (the top blocked job holds its vnodes)."""
import time

from pbs_power.pbs.attributes import QSTAT_TIME_FORMAT, parse_exec_vnode, parse_qstat_time
from pbs_power.pbs.demand import (exec_amounts, parse_duration, queued_demand,
                                  running_releases, vnode_space, waking_first)
from pbs_power.pbs.forecast import Release, Start, forecast_starts
from pbs_power.pbs.placement import DEFAULT_CHECKED, JobRequest, parse_place, parse_select

from test_pbs_placement import CHECKED, vnode

NOW = 1_800_000_000.0


def job(jid, select, walltime=None, place="free", instances=1):
    arrangement, sharing = parse_place(place)
    return JobRequest(jid, parse_select(select), arrangement, sharing, instances, walltime)


def freed(at, jid, *names, ncpus=4.0):
    return Release(at, jid, tuple((n, n, (("ncpus", ncpus),), True) for n in names))


def starts(jobs, vnodes, releases, checked=CHECKED):
    out = {}
    for s in forecast_starts(jobs, vnodes, releases, NOW, checked):
        out.setdefault(s.job_id, []).append((s.start, s.vnodes))
    return {jid: got[0] if len(got) == 1 else got for jid, got in out.items()}


# n001 and n002 run jobs until NOW+1000 and NOW+3000; n003 is free; n004, n005 asleep.
BUSY = [vnode("n001", ncpus=0, occupied=True), vnode("n002", ncpus=0, occupied=True),
        vnode("n003"), vnode("n004", asleep=True), vnode("n005", asleep=True)]
RUNNING = [freed(NOW + 3000, "2.s", "n002"), freed(NOW + 1000, "1.s", "n001")]


def test_a_job_that_fits_now_starts_now_free_vnodes_first():
    assert starts([job("10.s", "2:ncpus=4")], BUSY, RUNNING) == {
        "10.s": (None, ("n003", "n004"))}


def test_the_top_blocked_job_starts_when_walltimes_free_enough_room():
    # 4 chunks: n003, n004, n005 now, one more once 1.s's walltime ends
    # (NOW+1000, not n002's NOW+3000); awake vnodes first, in vnode order.
    out = starts([job("10.s", "4:ncpus=4")], BUSY, RUNNING)
    assert out == {"10.s": (NOW + 1000, ("n001", "n003", "n004", "n005"))}


def test_a_job_that_never_fits_gets_no_start_and_the_next_is_top():
    out = starts([job("10.s", "9:ncpus=4"), job("11.s", "5:ncpus=4")], BUSY, RUNNING)
    assert out == {"11.s": (NOW + 3000, ("n001", "n002", "n003", "n004", "n005"))}


def test_later_jobs_backfill_only_without_delaying_the_top_job():
    # 10.s holds n001, n003, n004, n005 from NOW+1000. 11.s (1 chunk, 3600 s)
    # would run past that and every vnode it could take now is held: no start.
    # 12.s ends by NOW+1000, so it starts now on n003. 13.s would run long
    # on held vnodes too: no start.
    jobs = [job("10.s", "4:ncpus=4", 7200), job("11.s", "1:ncpus=4", 3600),
            job("12.s", "1:ncpus=4", 900), job("13.s", "1:ncpus=4", 7200)]
    out = starts(jobs, BUSY, RUNNING)
    assert out == {"10.s": (NOW + 1000, ("n001", "n003", "n004", "n005")),
                   "12.s": (None, ("n003",))}


def test_a_long_job_backfills_where_the_top_job_leaves_room():
    # 10.s wants 3 hosts (scatter): n003 and n004 now, n001 from NOW+1000.
    # At that time n003 (8 ncpus) still has 4 free, so 11.s (4 ncpus, past
    # the shadow time) may start there now; 12.s, the same, finds no such
    # room left; 13.s ends before NOW+1000, so it may use what is free now.
    vnodes = [vnode("n001", ncpus=0, occupied=True), vnode("n003", ncpus=8),
              vnode("n004", asleep=True)]
    jobs = [job("10.s", "3:ncpus=4", 7200, place="scatter"), job("11.s", "1:ncpus=4", 7200),
            job("12.s", "1:ncpus=4", 7200), job("13.s", "1:ncpus=4", 600)]
    out = starts(jobs, vnodes, [freed(NOW + 1000, "1.s", "n001")])
    assert out == {"10.s": (NOW + 1000, ("n001", "n003", "n004")),
                   "11.s": (None, ("n003",)), "13.s": (None, ("n003",))}


def test_an_array_s_instances_start_now_until_one_waits():
    # three subjobs now on n003, n004, n005; the fourth is the top blocked job
    out = starts([job("7[].s", "1:ncpus=4", 600, instances=5)], BUSY, RUNNING)
    assert out["7[].s"] == [(None, ("n003", "n004", "n005")), (NOW + 1000, ("n001",))]


def test_exclusive_vnodes_are_free_again_only_when_their_last_job_ends():
    shared = [vnode("n001", ncpus=2, occupied=True), vnode("n002", asleep=True)]
    two = Release(NOW + 500, "1.s", (("n001", "n001", (("ncpus", 1.0),), False),))
    last = Release(NOW + 900, "2.s", (("n001", "n001", (("ncpus", 1.0),), True),))
    out = starts([job("9.s", "2:ncpus=4", place="excl")], shared, [two, last])
    assert out == {"9.s": (NOW + 900, ("n001", "n002"))}


def test_sleeping_vnodes_being_woken_are_counted_on_first():
    spaces = [vnode("n1", asleep=True), vnode("n2", asleep=True), vnode("n3")]
    ordered = waking_first(spaces, ["n2"])
    assert [s.name for s in ordered] == ["n2", "n3", "n1"]      # the fit puts n3 first
    out = starts([job("1.s", "2:ncpus=4")], ordered, [])
    assert out == {"1.s": (None, ("n3", "n2"))}


def test_sleeping_vnodes_not_being_woken_go_fastest_measured_boot_first():
    spaces = [vnode("n%d" % i, asleep=True) for i in range(1, 6)] + [vnode("n6")]
    boots = {"n1": 400.0, "n2": 90.0, "n4": 250.0}      # n3, n5: never measured
    ordered = waking_first(spaces, ["n1"], boots)
    # n1 is being woken: first whatever its boot; the rest by boot, an
    # unmeasured host as the median of the measured ones (250 s), ties in order
    assert [s.name for s in ordered] == ["n1", "n6", "n2", "n3", "n4", "n5"]
    assert [s.name for s in waking_first(spaces, [], {})] == ["n6", "n1", "n2", "n3",
                                                              "n4", "n5"]
    out = starts([job("1.s", "3:ncpus=4")], waking_first(spaces, [], boots), [])
    assert out == {"1.s": (None, ("n6", "n2", "n3"))}


# -- from qstat ------------------------------------------------------------------

def ctime(epoch):
    return time.strftime(QSTAT_TIME_FORMAT, time.localtime(epoch))


def test_walltimes_and_exec_vnode_amounts():
    assert parse_duration("01:30:00") == 5400 and parse_duration("90") == 90
    assert parse_duration("2:00") == 120 and parse_duration(None) is None
    assert parse_duration("soon") is None and parse_duration(7.0) == 7.0
    assert exec_amounts("(n1:ncpus=2:mem=1gb+n2:ncpus=1)+(n1:ncpus=2)") == (
        ("n1", (("ncpus", 4.0), ("mem", float(2 ** 30)))), ("n2", (("ncpus", 1.0),)))


def running(stime, walltime, exec_vnode, state="R"):
    return {"job_state": state, "stime": ctime(stime), "exec_vnode": exec_vnode,
            "Resource_List": {"walltime": walltime}}


def test_running_jobs_release_at_start_plus_walltime():
    doc = {"Jobs": {
        "1.s": running(NOW - 600, "00:20:00", "(n1:ncpus=4)"),         # ends NOW+600
        "2.s": running(NOW - 7200, "01:00:00", "(n2:ncpus=2)"),        # over: now
        "3.s": running(NOW - 60, "10:00:00", "(n2:ncpus=2)"),          # n2's last
        "4.s": running(NOW - 60, None, "(n3:ncpus=1)"),                # no walltime
        "5.s": running(NOW - 60, "00:10:00", "(n3:ncpus=3)", "E"),     # exiting: now
        "6.s": {"job_state": "Q"}}}
    rel = running_releases(doc, NOW, parse_qstat_time, {"n1": "h1"})
    assert [(r.job_id, r.at) for r in rel] in (
        [("2.s", NOW), ("5.s", NOW), ("1.s", NOW + 600), ("3.s", NOW + 35940)],
        [("5.s", NOW), ("2.s", NOW), ("1.s", NOW + 600), ("3.s", NOW + 35940)])
    by_id = {r.job_id: r.vnodes for r in rel}
    assert by_id["1.s"] == (("n1", "h1", (("ncpus", 4.0),), True),)
    assert by_id["2.s"] == (("n2", "n2", (("ncpus", 2.0),), False),)   # 3.s stays on n2
    assert by_id["3.s"][0][3] is True
    assert by_id["5.s"][0][3] is False               # 4.s holds n3 for as long as we know


def test_the_hook_gives_a_blocked_job_its_start_from_running_walltimes():
    # n1 runs 1.s until NOW+600 (walltime); n2, n3 asleep. 2.s needs 3 whole
    # vnodes: without a forecast it had no start at all (PBS gives none),
    # so its sleeping vnodes were woken only once n1 was free, and it waited
    # for their boot. Now it is known to start at NOW+600 on n1, n2 and n3.
    spaces = [vnode_space("n1", "n1", False, {"ncpus": 4}, {"ncpus": 4}, True, 1),
              vnode_space("n2", "n2", True, {"ncpus": 4}, {}, False, 1),
              vnode_space("n3", "n3", True, {"ncpus": 4}, {}, False, 1)]
    doc = {"Jobs": {"1.s": running(NOW - 600, "00:20:00", "(n1:ncpus=4)"),
                    "2.s": {"job_state": "Q", "queue": "workq", "qtime": ctime(NOW - 100),
                            "schedselect": "3:ncpus=4",
                            "Resource_List": {"select": "3:ncpus=4", "walltime": "1:00:00"}}}}
    out = queued_demand(doc, spaces, NOW, 60, DEFAULT_CHECKED, {}, parse_qstat_time,
                        parse_exec_vnode, lambda level, msg: None)
    assert [(j.id, j.estimated_start, j.vnodes) for j in out] == [
        ("2.s", NOW + 600, ("n1", "n2", "n3"))]


def test_start_is_a_plain_record():
    assert Start("1.s", None, ("n1",)).start is None


def test_vnodes_freed_by_running_jobs_are_counted_on_before_idle_ones():
    # 10.s waits for n2 and n3 (NOW+600); free n1 is not named, so the hook
    # may power it off meanwhile: n2 and n3 are up anyway when 10.s starts.
    vnodes = [vnode("n1"), vnode("n2", ncpus=0, occupied=True),
              vnode("n3", ncpus=0, occupied=True)]
    out = starts([job("10.s", "2:ncpus=4", place="scatter")], vnodes,
                 [freed(NOW + 600, "1.s", "n2", "n3")])
    assert out == {"10.s": (NOW + 600, ("n2", "n3"))}


# -- whole identical vnodes: counting gives the general fit's answer ---------------
def _unit_case(rng):
    """Random vnodes of one ncpus size, running jobs and whole-vnode jobs."""
    from pbs_power.pbs.placement import Chunk, VnodeSpace
    size = rng.choice([1, 2, 128])
    count = rng.randint(0, 30)
    vnodes = [VnodeSpace("v%03d" % i, "h%03d" % (i // rng.choice([1, 2])), rng.random() < 0.4,
                         {"ncpus": float(size), "mem": "8gb"}) for i in range(count)]
    # busy vnodes (nothing free), as a real server shows them; most run a job
    # that frees them, some run one with no walltime, some are a MoM's natural vnode
    busy = ["b%03d" % i for i in range(rng.randint(0, 12))]
    vnodes += [VnodeSpace(name, name, False, {"ncpus": rng.choice([0.0, 0, "0"])},
                          occupied=True) for name in busy]
    rng.shuffle(vnodes)
    rng.shuffle(busy)
    releases, used = [], 0
    for r in range(rng.randint(0, 8)):
        width = rng.randint(1, 6)
        names = [busy.pop() if busy and rng.random() < 0.7 else "f%03d" % (used + k)
                 for k in range(width)]
        used += width
        at = NOW + rng.choice([-50, 0, 100, 100, 600, 3600, 7200])
        releases.append(Release(at, "r%d.s" % r, tuple(
            (n, n, (("ncpus", float(size)),), True) for n in names)))
    jobs = []
    for k in range(rng.randint(1, 12)):
        parts = [rng.randint(1, 8) for _ in range(rng.choice([1, 1, 2]))]
        chunks = tuple(Chunk(n, (("ncpus", str(size)), ("mpiprocs", "4"))) for n in parts)
        wall = rng.choice([None, 60.0, 600.0, 3000.0, 90000.0])
        jobs.append(JobRequest("%d.s" % k, chunks, walltime=wall))
    return jobs, vnodes, releases


def test_whole_vnode_counting_gives_the_general_fit_s_answer():
    import random

    from pbs_power.pbs import forecast
    rng = random.Random(15)
    shadows = 0
    for _ in range(3000):
        jobs, vnodes, releases = _unit_case(rng)
        assert forecast._unit_amount(jobs, vnodes, releases, CHECKED) is not None
        general = forecast._general_starts(jobs, vnodes, releases, NOW, CHECKED)
        assert forecast.forecast_starts(jobs, vnodes, releases, NOW, CHECKED) == general
        shadows += any(s.start is not None for s in general)
    assert shadows > 500                      # the blocked-job paths were exercised


def test_anything_but_whole_identical_vnodes_takes_the_general_fit():
    from pbs_power.pbs import forecast
    from pbs_power.pbs.placement import VnodeSpace
    vnodes = [vnode("n001"), vnode("n002", asleep=True)]
    unit = forecast._unit_amount
    assert unit([job("1.s", "2:ncpus=4")], vnodes, [], CHECKED) == 4.0
    assert unit([job("1.s", "2:ncpus=2")], vnodes, [], CHECKED) is None
    assert unit([job("1.s", "2:ncpus=4:mem=1gb")], vnodes, [], CHECKED) is None
    assert unit([job("1.s", "2:ncpus=4", place="excl")], vnodes, [], CHECKED) is None
    assert unit([job("1.s", "2:ncpus=4", place="scatter")], vnodes, [], CHECKED) is None
    assert unit([job("1.s", "2:ncpus=4", instances=3)], vnodes, [], CHECKED) is None
    assert unit([job("1.s", "2:ncpus=4")], vnodes + [vnode("n003", ncpus=8)], [], CHECKED) is None
    assert unit([job("1.s", "2:ncpus=4")], vnodes, [freed(NOW, "9.s", "n001")], CHECKED) is None
    excl = VnodeSpace("n003", "n003", False, {"ncpus": 4.0}, sharing="force_excl")
    assert unit([job("1.s", "2:ncpus=4")], vnodes + [excl], [], CHECKED) is None
    assert unit([job("1.s", "2:ncpus=4")], vnodes, [], frozenset({"mem"})) is None
    ones = [VnodeSpace("n1", "n1", False, {"ncpus": 1.0}), VnodeSpace("n2", "n2", False, {"ncpus": 1})]
    assert unit([job("1.s", "2:ncpus=1")], ones, [], CHECKED) == 1.0
    truth = VnodeSpace("n3", "n3", False, {"ncpus": True})     # not a number to the fit
    assert unit([job("1.s", "2:ncpus=1")], ones + [truth], [], CHECKED) is None
    twice = [freed(NOW, "8.s", "b1", ncpus=1.0), freed(NOW + 9, "9.s", "b1", ncpus=1.0)]
    assert unit([job("1.s", "2:ncpus=1")], ones, twice, CHECKED) is None
    busy = VnodeSpace("b1", "b1", False, {"ncpus": 0.0}, occupied=True)
    assert unit([job("1.s", "2:ncpus=1")], ones + [busy], twice[:1], CHECKED) == 1.0
    assert unit([job("1.s", "2:ncpus=1")], ones, [freed(NOW, "8.s", "n1", ncpus=1.0)],
                CHECKED) is None                  # freed onto a vnode with room: 2 chunks


def test_a_real_server_s_busy_cluster_is_counted_whole_vnode_by_whole_vnode():
    # As a real OpenPBS 23.06 shows it (pbsnodes -av, qstat -f -F json): the
    # MoM's natural vnode with resources_available.ncpus 0, gpu001 running
    # 2.s with ncpus 4 of 4 assigned, gpu002-4 asleep with 4 each, and 3.s
    # (select=4:ncpus=4) queued. The count applies, and gives the general
    # fit's answer: 3.s starts when 2.s's walltime ends, freed gpu001 first.
    from pbs_power.pbs import forecast
    spaces = [vnode_space("pbshost", "pbshost", False, {"ncpus": 0, "mem": "0kb"}, {}, False, 1),
              vnode_space("gpu001", "gpu001", False, {"ncpus": 4, "mem": "8gb"},
                          {"ncpus": 4, "mem": "0kb"}, True, 1)]
    spaces += [vnode_space(n, n, True, {"ncpus": 4, "mem": "8gb"}, {}, False, 1)
               for n in ("gpu002", "gpu003", "gpu004")]
    doc = {"Jobs": {"2.pbshost": running(NOW - 100, "00:04:00", "(gpu001:ncpus=4)")}}
    releases = running_releases(doc, NOW, parse_qstat_time, {s.name: s.host for s in spaces})
    jobs = [job("3.pbshost", "4:ncpus=4", 120)]
    assert forecast._unit_amount(jobs, spaces, releases, DEFAULT_CHECKED) == 4.0
    assert forecast_starts(jobs, spaces, releases, NOW, DEFAULT_CHECKED) == \
        forecast._general_starts(jobs, spaces, releases, NOW, DEFAULT_CHECKED) == (
        Start("3.pbshost", NOW + 140, ("gpu001", "gpu002", "gpu003", "gpu004")),)
