"""pydvm.placement: the parsers of mpirun's placement options and the mapper.

Three kinds of tests: examples (each rule, each message), properties
(Hypothesis: every rank placed once, per-node counts, slot limits, rank
orders), and **parity with mpirun's own mapper**: ``mpirun --do-not-launch
--display-map`` (Open MPI 4.1) maps a job on hosts that need not exist and
prints the map without starting anything, so the same options are given to
both and the host of every rank compared -- by Hypothesis over random host
lists, counts and policies.  (``--do-not-launch`` assumes every host has
this machine's topology; the pydvm side is given it with ``topology.read().counts()``.)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pydvm import placement as PL
from pydvm.placement import Host, map_job
from pydvm.runtime.node import topology

MPIRUN = shutil.which("mpirun")


def hosts(text: str, topo: dict | None = None) -> list[Host]:
    out = []
    for part in text.split(","):
        name, _, slots = part.partition(":")
        out.append(Host(name, int(slots or 1), None, topo))
    return out


def one(n, text, **placement) -> list[str]:
    return map_job([(n, hosts(text))], placement)[0]


# ----------------------------------------------------------------------
# parsers
# ----------------------------------------------------------------------


@pytest.mark.parametrize("text, want", [
    ("node", {"map_by": "node"}),
    ("SLOT", {"map_by": "slot"}),
    ("Node:OverSubscribe", {"map_by": "node", "oversubscribe": True}),
    ("core:NOOVERSUBSCRIBE", {"map_by": "core", "oversubscribe": False}),
    ("socket:PE=2,SPAN", {"map_by": "socket", "pe": 2, "span": True}),
    ("socket:pe=2:span", {"map_by": "socket", "pe": 2, "span": True}),
    ("package", {"map_by": "socket"}),
    ("ppr:2:node", {"map_by": "ppr", "ppr": [2, "node"]}),
    ("ppr:1:Socket:PE=2", {"map_by": "ppr", "ppr": [1, "socket"], "pe": 2}),
    ("l3cache", {"map_by": "l3cache"}),
    ("hwthread", {"map_by": "hwthread"}),
    ("numa", {"map_by": "numa"}),
])
def test_parse_map_by(text, want):
    assert PL.parse_map_by(text) == want


@pytest.mark.parametrize("text, gist", [
    ("foo", "'foo' (--map-by foo) is not recognized"),
    ("node:BAR", "unrecognized modifier 'BAR'"),
    ("node:PE=0", "PE (cpus per process) must be a positive integer, not '0'"),
    ("node:PE=x", "not 'x'"),
    ("ppr:2", "ppr:N:RESOURCE"),
    ("ppr:x:node", "number of processes per resource (ppr) must be a positive integer"),
    ("ppr:2:foo", "unrecognized resource 'foo'"),
    ("board", "not supported by pydvm; use node"),
    ("", "is not recognized"),
])
def test_parse_map_by_refuses_naming_the_text(text, gist):
    with pytest.raises(ValueError, match=re.escape(gist)):
        PL.parse_map_by(text)


def test_parse_rank_by_and_bind_to():
    assert PL.parse_rank_by("NODE") == "node"
    assert PL.parse_rank_by("core:span") == "core"
    assert PL.parse_rank_by("socket:FILL") == "socket"
    with pytest.raises(ValueError, match="ranking policy 'foo'"):
        PL.parse_rank_by("foo")
    with pytest.raises(ValueError, match="unrecognized modifier 'x'"):
        PL.parse_rank_by("node:x")
    assert PL.parse_bind_to("core") == {"bind_to": "core", "overload": False}
    assert PL.parse_bind_to("core:overload-allowed") == {"bind_to": "core", "overload": True}
    assert PL.parse_bind_to("Socket:if-supported,overload-allowed") == {
        "bind_to": "socket", "overload": True}
    assert PL.parse_bind_to("none") == {"bind_to": "none", "overload": False}
    with pytest.raises(ValueError, match="binding policy 'foo'"):
        PL.parse_bind_to("foo")
    with pytest.raises(ValueError, match="qualifier 'x'"):
        PL.parse_bind_to("core:x")


def test_parse_cpu_list():
    assert PL.parse_cpu_list("0,2-3") == [0, 2, 3]
    assert PL.parse_cpu_list("3,1,1-2") == [1, 2, 3]
    for bad in ("", "a", "3-1", "-1", "1,,2"):
        with pytest.raises(ValueError, match="bad cpu list"):
            PL.parse_cpu_list(bad)


def test_read_hostfile_in_open_mpis_format(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# the cluster\n\na slots=2\nb count=3 max_slots=4\nc cpu=2 # trailing\n"
                 "d\ne max-slots=3\nuser@f slots_max=5 slots=2\ng\ng\ng\na\n")
    # as mpirun's --display-map shows them (Num slots / Max slots): a bare
    # repeat adds a slot, max_slots alone gives that many slots
    assert PL.read_hostfile(str(f)) == [["a", 3, None], ["b", 3, 4], ["c", 2, None],
                                        ["d", 1, None], ["e", 3, 3], ["f", 2, 5],
                                        ["g", 3, None]]


@pytest.mark.parametrize("text, gist", [
    ("a\na slots=2\n", ":2: host 'a' is listed again with a slot count"),
    ("a slots=2\na slots=2\n", ":2: host 'a' is listed again with a slot count"),
    ("a slots=x\n", ":1: bad value in 'slots=x'"),
    ("a slots=0\n", ":1: bad value"),
    ("a slots=2 max_slots=1\n", ":1: max_slots=1 is less than slots=2"),
    ("a foo=2\n", ":1: cannot parse 'foo=2'"),
    ("\n# nothing\n", "names no host"),
])
def test_read_hostfile_errors_name_file_and_line(tmp_path, text, gist):
    f = tmp_path / "hf"
    f.write_text(text)
    with pytest.raises(ValueError, match=re.escape(gist)) as e:
        PL.read_hostfile(str(f))
    assert str(f) in str(e.value)


def test_read_hostfile_missing_file(tmp_path):
    with pytest.raises(ValueError, match="cannot read hostfile .*nope"):
        PL.read_hostfile(str(tmp_path / "nope"))


def test_read_topology_of_this_machine():
    t = topology.read().counts()
    n = len(os.sched_getaffinity(0))
    assert t["hwthread"] == n and 1 <= t["core"] <= n and 1 <= t["socket"] <= t["core"]
    assert set(t) == set(PL.OBJECTS)
    assert topology.read(allowed={0}).counts()["hwthread"] == 1


# ----------------------------------------------------------------------
# the mapper: examples
# ----------------------------------------------------------------------


def test_without_mapping_options_spec9_wraps_each_app_on_its_own():
    assert one(3, "a:1") == ["a", "a", "a"]
    assert one(6, "a:2,b:1") == ["a", "a", "b", "a", "a", "b"]
    two = map_job([(2, hosts("a:2,b:2")), (2, hosts("a:2,b:2"))], {})
    assert two == [["a", "a"], ["a", "a"]]  # each app from its first host (SPEC 9)
    # display and binding keys are not mapping options
    assert one(3, "a:1,b:1", display_map=True, bind_to="core") == ["a", "b", "a"]


def test_mpiexecs_ppn_and_wrap_over_the_job():
    """-ppn N: every host counts N slots; wrap "job": an app on the same hosts
    goes on from the slot after the previous app's last rank (Hydra)."""
    assert one(6, "a:3,b:1", ppn=2) == ["a", "a", "b", "b", "a", "a"]
    assert one(None, "a:3,b:1", ppn=2) == ["a", "a", "b", "b"]
    ab = hosts("a:1,b:1")
    assert map_job([(1, ab), (2, ab), (1, ab)], {"wrap": "job"}) == [["a"], ["b", "a"], ["b"]]
    assert map_job([(1, ab), (2, ab)], {"wrap": "app"}) == [["a"], ["a", "b"]]
    # an app on other hosts starts from their first slot
    assert map_job([(1, ab), (1, hosts("b:1,a:1"))], {"wrap": "job"}) == [["a"], ["b"]]
    with pytest.raises(ValueError, match="-ppn must be a positive integer"):
        one(1, "a:1", ppn=0)
    with pytest.raises(ValueError, match="wrap must be"):
        one(1, "a:1", wrap="node")


def test_read_hydra_hostfile(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# mpiexec's\nn1:2\nn1\n\n  n2   # one slot\nn3:4\n")
    assert PL.read_hydra_hostfile(str(f)) == [["n1", 3], ["n2", 1], ["n3", 4]]
    with pytest.raises(ValueError, match="cannot read host file"):
        PL.read_hydra_hostfile(str(tmp_path / "none"))


def test_n_derived_as_mpirun_does():
    assert one(None, "a:2,b:3") == ["a", "a", "b", "b", "b"]
    assert one(None, "a:2,b:3", npernode=1) == ["a", "b"]
    assert one(None, "a:2,b:3", map_by="ppr", ppr=[2, "node"]) == ["a", "a", "b", "b"]
    topo = {"socket": 2, "core": 4}
    got = map_job([(None, hosts("a:8,b:8", topo))], {"map_by": "ppr", "ppr": [3, "socket"]})
    assert Counter(got[0]) == {"a": 6, "b": 6}


def test_nooversubscribe_refuses_naming_requested_and_available():
    with pytest.raises(ValueError) as e:
        map_job([(5, hosts("a:2,b:2"))], {"oversubscribe": False}, ["./hello"])
    msg = str(e.value)
    assert "not enough slots available" in msg and "./hello requests 5 slots" in msg
    assert "have 4 (a:2, b:2)" in msg and "--oversubscribe" in msg
    assert one(4, "a:2,b:2", oversubscribe=False) == ["a", "a", "b", "b"]
    with pytest.raises(ValueError, match="places 2 processes on a, which has 1 slot"):
        one(None, "a:1,b:3", npernode=2, oversubscribe=False)


def test_oversubscription_is_allowed_by_default_with_any_policy():
    assert one(5, "a:2,b:2") == ["a", "a", "b", "b", "a"]  # SPEC 9 wrap
    assert one(5, "a:2,b:2", map_by="slot") == ["a", "a", "a", "b", "b"]  # mpirun's
    assert one(5, "a:2,b:2", map_by="node") == ["a", "b", "a", "b", "a"]


def test_max_slots_is_a_hard_limit():
    hs = [Host("a", 1, 2), Host("b", 1, None)]
    assert map_job([(5, hs)], {})[0] == ["a", "b", "a", "b", "b"]  # wrap passes a over
    hs = [Host("a", 1, 1), Host("b", 1, 2)]
    with pytest.raises(ValueError, match="max_slots allow .*a max_slots=1, b max_slots=2"):
        map_job([(4, hs)], {})
    with pytest.raises(ValueError, match="4 processes on a, whose max_slots is 3"):
        map_job([(6, [Host("a", 2, 3), Host("b", 1)])], {"oversubscribe": True})


def test_ppr_refuses_more_than_it_places_and_unknown_topology():
    with pytest.raises(ValueError, match=r"8 processes requested, more than ppr:2:node places "
                                         r"on its 3 host\(s\) \(6\)"):
        one(8, "a:2,b:2,c:2", map_by="ppr", ppr=[2, "node"])
    with pytest.raises(ValueError, match="more than -N 1 places"):
        one(4, "a:2,b:2,c:2", npernode=1)
    with pytest.raises(ValueError, match="node a has not reported its topology"):
        one(2, "a:2", map_by="ppr", ppr=[1, "socket"])
    with pytest.raises(ValueError, match="not reported its topology"):
        one(2, "a:2", map_by="core", span=True)


def test_mpmd_apps_share_the_slots_under_mpirun_mapping():
    hs = "a:2,b:2,c:2"
    assert map_job([(2, hosts(hs)), (2, hosts(hs))], {"map_by": "slot"}) == [
        ["a", "a"], ["b", "b"]]
    assert map_job([(2, hosts(hs)), (3, hosts(hs))], {"rank_by": "node"}) == [
        ["a", "a"], ["b", "c", "b"]]
    assert map_job([(1, hosts("a:2")), (3, hosts("b:2,c:2"))], {"map_by": "slot"}) == [
        ["a"], ["b", "b", "c"]]


def test_display_lines_in_mpiruns_shape():
    alloc = PL.display_allocation_lines([("a", 2, None), ("b", 1, 3)])
    assert alloc == ["", "======================   ALLOCATED NODES   ======================",
                     "\ta: slots=2 max_slots=0 slots_inuse=0 state=UP",
                     "\tb: slots=1 max_slots=3 slots_inuse=0 state=UP",
                     "================================================================="]
    m = PL.display_map_lines("dvm@3", [(0, 0, "a"), (2, 1, "a"), (1, 0, "b")],
                             [("a", 2, None), ("b", 1, 3)])
    assert m[0] == " Data for JOB [dvm@3] offset 0 Total slots allocated 3"
    assert " Data for node: a\tNum slots: 2\tMax slots: 0\tNum procs: 2" in m
    assert " \tProcess jobid: [dvm@3] App: 1 Process rank: 2 Bound: N/A" in m
    assert m.index(" Data for node: b\tNum slots: 1\tMax slots: 3\tNum procs: 1") > m.index(
        " \tProcess jobid: [dvm@3] App: 1 Process rank: 2 Bound: N/A")


# ----------------------------------------------------------------------
# the mapper: properties
# ----------------------------------------------------------------------

host_lists = st.lists(st.integers(1, 4), min_size=1, max_size=4).map(
    lambda slots: [Host(chr(97 + i), s, None, {"core": 2, "socket": 1, "numa": 1,
                                               "hwthread": 2, "l3cache": 1})
                   for i, s in enumerate(slots)])
policies = st.fixed_dictionaries({}, optional={
    "map_by": st.sampled_from(PL.MAP_POLICIES),
    "rank_by": st.sampled_from(PL.RANK_POLICIES),
    "span": st.booleans(),
    "oversubscribe": st.sampled_from([True, False, None]),
})


@settings(max_examples=300, deadline=None)
@given(hs=host_lists, n=st.integers(1, 20), placement=policies)
def test_every_rank_is_placed_once_on_a_host_of_its_app(hs, n, placement):
    slots = sum(h.slots for h in hs)
    try:
        got = map_job([(n, hs)], placement)[0]
    except ValueError as e:
        # the one refusal here: more ranks than slots, oversubscription refused
        assert placement.get("oversubscribe") is False and n > slots, e
        assert "not enough slots available" in str(e)
        return
    assert len(got) == n and set(got) <= {h.name for h in hs}
    per = Counter(got)
    if n <= slots and not placement.get("span"):
        # within the slots, no host runs more ranks than its slots
        assert all(per[h.name] <= h.slots for h in hs), (per, hs)
    if placement.get("map_by") in (None, "slot") and n <= slots and not placement.get("span"):
        # by slot: the first hosts are full (in order)
        full = [per[h.name] for h in hs]
        assert full == [min(h.slots, max(0, n - sum(x.slots for x in hs[:i])))
                        for i, h in enumerate(hs)]
    rank_by = placement.get("rank_by") or ("node" if placement.get("map_by") == "node"
                                           else "slot")
    order = [h.name for h in hs if per[h.name]]
    if rank_by == "node":
        # rank r goes to the next host (in order) that still has ranks to take
        left, want = dict(per), []
        while len(want) < n:
            for h in order:
                if left[h]:
                    want.append(h)
                    left[h] -= 1
        assert got == want
    elif is_mpirun(placement):
        assert got == [h for h in order for _ in range(per[h])]  # each host's ranks in turn


def is_mpirun(placement):
    return PL.is_mpirun_mapping(placement)


@settings(max_examples=200, deadline=None)
@given(hs=host_lists, per=st.integers(1, 3), data=st.data())
def test_ppr_puts_n_per_object_on_each_host(hs, per, data):
    kind = data.draw(st.sampled_from(PL.PPR_RESOURCES))
    most = sum(per * h.objects(kind) for h in hs)
    n = data.draw(st.one_of(st.none(), st.integers(1, most)))
    got = map_job([(n, hs)], {"map_by": "ppr", "ppr": [per, kind]})[0]
    counts = Counter(got)
    assert len(got) == (most if n is None else n)
    for h in hs:  # hosts fill in order, each with at most N per object
        assert counts[h.name] <= per * h.objects(kind)
    full = [counts[h.name] == per * h.objects(kind) for h in hs]
    assert full == sorted(full, reverse=True) or n is not None and sum(full) >= 0


# ----------------------------------------------------------------------
# parity with mpirun's mapper (--do-not-launch --display-map)
# ----------------------------------------------------------------------

needs_mpirun = pytest.mark.skipif(MPIRUN is None, reason="Open MPI's mpirun is not installed")


def mpirun_map(args: list[str]) -> tuple[list[list[str]] | None, str]:
    """Where ``mpirun ARGS`` would put each rank of each app (None and the
    error text when it refuses), without launching anything."""
    argv = [MPIRUN, "--do-not-launch", "--display-map", "--bind-to", "none"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PYDVM_"))}
    p = subprocess.run(argv + args, capture_output=True, text=True, timeout=60, env=env)
    out = p.stdout + p.stderr
    procs: list[tuple[int, int, str]] = []
    node = None
    for ln in out.splitlines():
        m = re.match(r"\s*Data for node: (\S+)", ln)
        if m:
            node = m.group(1)
        m = re.search(r"App: (\d+) Process rank: (\d+)", ln)
        if m:
            procs.append((int(m.group(2)), int(m.group(1)), node))
    if not procs:
        return None, out
    napps = max(a for _, a, _ in procs) + 1
    apps: list[list[str]] = [[] for _ in range(napps)]
    for _, app, host in sorted(procs):
        apps[app].append(host)
    return apps, out


def mpirun_args(hs: list[Host], apps: list[int | None], placement: dict) -> list[str]:
    """mpirun's command line for the same job (every app on the same hosts)."""
    args = ["--host", ",".join(f"{h.name}:{h.slots}" for h in hs)]
    if placement.get("map_by") == "ppr":
        n, res = placement["ppr"]
        args += ["--map-by", f"ppr:{n}:{res}"]
    elif placement.get("map_by"):
        args += ["--map-by", placement["map_by"] + (":SPAN" if placement.get("span") else "")]
    if placement.get("npernode"):
        args += ["-N", str(placement["npernode"])]
    if placement.get("rank_by"):
        args += ["--rank-by", placement["rank_by"]]
    # pydvm's None is mpirun's --oversubscribe (SPEC 9's default)
    args.append("--nooversubscribe" if placement.get("oversubscribe") is False
                else "--oversubscribe")
    for i, n in enumerate(apps):
        if i:
            args.append(":")
        args += (["-n", str(n)] if n is not None else []) + ["true"]
    return args


def gist(text: str) -> str:
    if "not enough slots" in text or "are already filled" in text:
        return "slots"
    if "more processes than the ppr" in text or re.search(r"more than (ppr:|-N )", text):
        return "ppr"
    return text


@needs_mpirun
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(slots=st.lists(st.integers(1, 3), min_size=1, max_size=3),
       apps=st.lists(st.integers(1, 9), min_size=1, max_size=2),
       placement=st.one_of(
           st.fixed_dictionaries({"map_by": st.sampled_from(["slot", "node", "core", "hwthread",
                                                             "socket", "numa"])},
                                 optional={"rank_by": st.sampled_from(["slot", "node"]),
                                           "oversubscribe": st.sampled_from([False, None])}),
           st.fixed_dictionaries({"map_by": st.sampled_from(["core", "hwthread"]),
                                  "span": st.just(True)}),
           st.fixed_dictionaries({"rank_by": st.sampled_from(["node", "slot", "core"]),
                                  "oversubscribe": st.sampled_from([False, True])}),
           st.fixed_dictionaries({"map_by": st.just("ppr"),
                                  "ppr": st.tuples(st.integers(1, 2), st.sampled_from(
                                      ["node", "core"])).map(list)},
                                 optional={"rank_by": st.sampled_from(["slot", "node"])}),
           st.fixed_dictionaries({"npernode": st.integers(1, 3)})))
def test_same_hosts_as_mpirun(slots, apps, placement):
    """Random hosts, counts, policies and MPMD apps: each rank on the host
    mpirun would put it on, or both refuse for the same reason."""
    topo = topology.read().counts()  # what --do-not-launch assumes of every host
    hs = [Host(chr(97 + i), s, None, topo) for i, s in enumerate(slots)]
    per_node = placement.get("npernode") or placement.get("ppr", [0, ""])[1] == "node"
    # no -n: N per node x nodes, as mpirun; ppr:N:core without -n is left
    # out: mpirun 4.1 then asks for one rank per slot and refuses when the
    # ppr places fewer -- pydvm places N per core (test below pins it)
    sizes: list[int | None] = [None if per_node and n % 2 else n for n in apps]
    if (placement.get("map_by") == "ppr" or placement.get("npernode")) and len(apps) > 1 and (
            placement.get("ppr", [0, "node"])[1] != "node"
            or any(n is not None for n in sizes[1:])):
        # MPMD apps of ppr with -n: mpirun 4.1 starts each later app's count
        # over from the first host (ppr:2:node on a:1,b:2, apps of 4 and 2:
        # the second on a, a) and counts the objects earlier apps used in a
        # way pydvm does not follow; pydvm goes on where the last app ended
        # (docs/placement.md)
        sizes = sizes[:1]
    if placement.get("span") and placement.get("map_by") not in (None, "slot", "node", "ppr") \
            and len(sizes) > 1:
        # MPMD apps of an object mapping with :SPAN: where the previous app
        # filled the slots of the host it ended on, mpirun 4.1 may still put
        # the next app's first ranks on that host's free objects (a:1,b:3,
        # map-by core:span, apps of 1 and 3: a,b,b); pydvm goes on at the
        # next host with a free slot (b,b,b; docs/placement.md)
        sizes = sizes[:1]
    want, text = mpirun_map(mpirun_args(hs, sizes, placement))
    try:
        got = map_job([(n, hs) for n in sizes], placement)
    except ValueError as e:
        assert want is None, f"pydvm refused ({e}) where mpirun maps {want}"
        assert gist(str(e)) == gist(text), (str(e), text)
        return
    assert want is not None, f"mpirun refused ({text[:400]}) where pydvm maps {got}"
    assert got == want, (placement, sizes, slots)


@needs_mpirun
def test_max_slots_differs_from_mpirun_4_1_on_purpose(tmp_path):
    """Open MPI 4.1.4 lets --oversubscribe run more ranks on a host than its
    hostfile's max_slots (4 on ``a slots=2 max_slots=3``); pydvm holds
    max_slots as the limit its name says (docs/placement.md)."""
    hf = tmp_path / "hf"
    hf.write_text("a slots=2 max_slots=3\nb slots=1\n")
    want, _ = mpirun_map(["--hostfile", str(hf), "--oversubscribe", "-n", "6", "true"])
    assert want == [["a", "a", "a", "a", "b", "b"]]
    entries = PL.read_hostfile(str(hf))
    hs = [Host(n, s, m) for n, s, m in entries]
    with pytest.raises(ValueError, match="4 processes on a, whose max_slots is 3"):
        map_job([(6, hs)], {"oversubscribe": True})
    # within max_slots both run it
    want, _ = mpirun_map(["--hostfile", str(hf), "--oversubscribe", "-n", "4", "true"])
    assert map_job([(4, hs)], {"oversubscribe": True}) == want == [["a", "a", "a", "b"]]


@needs_mpirun
def test_ppr_over_objects_without_n_differs_from_mpirun_4_1_on_purpose():
    """Without -n, mpirun 4.1 gives ``ppr:1:core`` one rank per slot and
    refuses when that is more than one per core (3 slots, 2 cores here);
    pydvm runs one per core, what the option says (as ``ppr:N:node`` does
    in both)."""
    topo = topology.read().counts()
    want, text = mpirun_map(["--host", "a:9", "--map-by", "ppr:1:core", "true"])
    assert want is None and "more processes than the ppr" in text
    got = map_job([(None, [Host("a", 9, None, topo)])], {"map_by": "ppr", "ppr": [1, "core"]})
    assert got == [["a"] * topo["core"]]


@needs_mpirun
def test_hostfile_slots_as_mpirun_reads_them(tmp_path):
    """Each host's slots and max_slots as mpirun's map shows them."""
    hf = tmp_path / "hf"
    hf.write_text("# c\na slots=2\nb count=3 max_slots=4\nc cpu=2 # x\nd\ne max-slots=3\n"
                  "g\ng\ng\n")
    _, text = mpirun_map(["--hostfile", str(hf), "-N", "1", "true"])
    seen = re.findall(r"Data for node: (\S+)\s+Num slots: (\d+)\s+Max slots: (\d+)", text)
    theirs = [[n, int(s), int(m) or None] for n, s, m in seen]
    assert theirs == PL.read_hostfile(str(hf))
