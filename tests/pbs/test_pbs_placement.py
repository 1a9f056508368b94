"""The wake path's fit: queued jobs' select/place onto free plus sleeping vnodes."""
import pytest

from pbs_power.pbs.placement import (Chunk, JobRequest, SelectError, VnodeSpace, count_indices,
                                     fit_jobs, parse_amount, parse_place, parse_select)

CHECKED = frozenset({"ncpus", "mem", "arch", "host", "vnode", "ngpus", "model"})


def vnode(name, asleep=False, ncpus=4, mem="8gb", host=None, occupied=False,
          sharing="default_shared", **extra):
    free = {"ncpus": ncpus, "mem": parse_amount(mem), "host": host or name, "vnode": name,
            "arch": "linux"}
    free.update(extra)
    return VnodeSpace(name, host or name, asleep, free, occupied, sharing)


def job(jid, select, place="free", instances=1):
    arrangement, sharing = parse_place(place)
    return JobRequest(jid, parse_select(select), arrangement, sharing, instances)


# n001 busy (no room left), n002 free, n003 and n004 asleep: the real test cluster's shape.
CLUSTER = [vnode("n001", ncpus=0, occupied=True), vnode("n002"),
           vnode("n003", asleep=True), vnode("n004", asleep=True)]


def wakes(jobs, vnodes=CLUSTER, checked=CHECKED):
    return {f.job_id: f.wake for f in fit_jobs(jobs, vnodes, checked)}


def test_parse_select_and_place():
    assert parse_select("2:ncpus=4:mem=2gb+ngpus=1") == (
        Chunk(2, (("ncpus", "4"), ("mem", "2gb"))), Chunk(1, (("ngpus", "1"),)))
    assert parse_place("scatter:excl") == ("scatter", "excl")
    assert parse_place(None) == ("free", "")
    assert parse_place("pack:group=switch") == ("pack", "")
    for bad in ("2:ncpus", "+", "0:ncpus=1"):
        with pytest.raises(SelectError):
            parse_select(bad)
    with pytest.raises(SelectError):
        parse_place("sideways")


def test_sizes_and_indices():
    assert parse_amount("8gb") == 8 * 2 ** 30 and parse_amount("1024kb") == 2 ** 20
    assert parse_amount("2w") == 16 and parse_amount(3) == 3.0 and parse_amount("linux") is None
    assert count_indices("1-3,7") == 4 and count_indices("1-9:2") == 5 and count_indices(3) == 1


def test_job_needing_two_sleeping_vnodes_wakes_both():
    assert wakes([job("1", "3:ncpus=4", "scatter")]) == {"1": ("n003", "n004")}


def test_job_that_fits_awake_vnodes_wakes_nothing_and_uses_them_up():
    # 1 and 2 fit on n002 (4 ncpus); 3 then needs a sleeping vnode, 4 another one.
    assert wakes([job(str(i), "1:ncpus=2") for i in range(1, 5)]) == {
        "3": ("n003",), "4": ("n003",)}
    assert wakes([job(str(i), "1:ncpus=4") for i in range(1, 5)]) == {
        "2": ("n003",), "3": ("n004",)}


def test_job_too_big_even_with_every_sleeping_vnode_takes_nothing():
    # 1 cannot run (16 ncpus > 12 in n002..n004); 2 is not starved by it.
    assert wakes([job("1", "4:ncpus=4", "scatter"), job("2", "1:ncpus=4+1:ncpus=4",
                                                       "scatter")]) == {"2": ("n003",)}


def test_pack_keeps_chunks_on_one_host():
    assert wakes([job("1", "2:ncpus=2:mem=5gb", "pack")]) == {}     # 10gb > any one vnode
    assert wakes([job("1", "2:ncpus=3", "pack")]) == {}             # 6 ncpus > 4
    assert wakes([job("1", "2:ncpus=2", "pack"), job("2", "2:ncpus=2", "pack")]) == {
        "2": ("n003",)}


def test_vscatter_and_scatter_on_a_multi_vnode_host():
    big = [vnode("big[0]", host="big", asleep=True), vnode("big[1]", host="big", asleep=True)]
    assert wakes([job("1", "2:ncpus=1", "vscatter")], big) == {"1": ("big[0]", "big[1]")}
    assert wakes([job("1", "2:ncpus=1", "scatter")], big) == {}


def test_excl_and_exclhost_need_empty_vnodes():
    shared_busy = [vnode("a", ncpus=3, occupied=True), vnode("b", asleep=True)]
    assert wakes([job("1", "1:ncpus=1", "free:excl")], shared_busy) == {"1": ("b",)}
    assert wakes([job("1", "1:ncpus=1", "free:shared")], shared_busy) == {}
    # excl takes the whole vnode: the next job cannot share it
    assert wakes([job("1", "1:ncpus=1", "excl"), job("2", "1:ncpus=1")],
                 [vnode("a", asleep=True), vnode("b", asleep=True)]) == {
        "1": ("a",), "2": ("b",)}
    host = [vnode("h[0]", host="h", occupied=True, ncpus=2), vnode("h[1]", host="h", asleep=True),
            vnode("k", asleep=True)]
    assert wakes([job("1", "1:ncpus=1", "exclhost")], host) == {"1": ("k",)}


def test_vnode_sharing_overrides_the_request():
    forced = [vnode("a", ncpus=3, occupied=True, sharing="force_excl"), vnode("b", asleep=True)]
    assert wakes([job("1", "1:ncpus=1", "shared")], forced) == {"1": ("b",)}
    ignored = [vnode("a", ncpus=3, occupied=True, sharing="ignore_excl"), vnode("b", asleep=True)]
    assert wakes([job("1", "1:ncpus=1", "excl")], ignored) == {}


def test_gpus_and_host_level_strings():
    gpu = [vnode("c1", ncpus=4), vnode("g1", asleep=True, ngpus=2, model="a100"),
           vnode("g2", asleep=True, ngpus=4, model="h100")]
    assert wakes([job("1", "1:ncpus=1:ngpus=1")], gpu) == {"1": ("g1",)}
    assert wakes([job("1", "1:ngpus=1:model=h100")], gpu) == {"1": ("g2",)}
    assert wakes([job("1", "1:ngpus=3")], gpu) == {"1": ("g2",)}
    assert wakes([job("1", "1:ncpus=1:ngpus=1")], gpu, CHECKED - {"ngpus", "model"}) == {}


def test_array_subjobs_each_take_room():
    assert wakes([job("7[]", "1:ncpus=4", instances=3)]) == {"7[]": ("n003", "n004")}
    assert wakes([job("7[]", "1:ncpus=4", instances=1)]) == {}


def test_order_decides_who_gets_the_sleeping_room():
    first, second = job("1", "1:ncpus=4+1:ncpus=4", "scatter"), job("2", "1:ncpus=4")
    assert wakes([first, second]) == {"1": ("n003",), "2": ("n004",)}
    three = [job("1", "3:ncpus=4", "scatter"), job("2", "1:ncpus=4")]
    assert wakes(three) == {"1": ("n003", "n004")}
