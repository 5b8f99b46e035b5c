"""PMIx tools from outside reach every DVM from the master's machine, head node or not.

A DVM whose nodes are all daemons -- named local nodes (``--hosts n1:2,n2:2``,
the README's quick start), or a login node's master with ``--launcher ssh``
onto compute nodes -- has no node in the master's process; its tools attach
to a tool server beside the master all the same, as PRRTE's ``prte`` serves
tools whatever its hosts (runtime/pmixhost/tools.py, "Where").  Each check runs
against both kinds of DVM: what a tool sees must not depend on it.

Like tests/pmix_e2e/test_tools.py, each DVM has a private ``TMPDIR``, so the
rendezvous files a tool searches for are that DVM's only.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from pmixkit import FAR, HEAD
from dvmkit import LineReader, finish, start_dvm, wait_for
from test_debugger import waiting
from test_tools import active_nspaces, pmix_dir, run_tool, tool_env, tool_uri

#: the DVM kinds: (its hosts, the node a daemon serves, the other node)
KINDS = {"head": (f"{HEAD}:4,{FAR}:4", FAR, HEAD), "no-head": ("n1:2,n2:2", "n2", "n1")}


def _dvm(hosts: str, **mca):
    """A DVM of ``hosts`` under a short private directory (socket paths), its
    own TMPDIR; (the DVM, that directory)."""
    for t in ("pps", "pattrs", "pevent"):
        if not shutil.which(t):
            pytest.skip(f"{t} not installed (apt-get install libpmix-bin)")
    tmp = Path(tempfile.mkdtemp(prefix="tany"))
    tmpdir = tmp / "tmp"
    tmpdir.mkdir()
    saved = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmpdir)
    try:
        d = start_dvm(tmp, hosts, {"pydvm_pmix": "on", "pydvm_pmix_isolate": "auto", **mca})
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if saved is None:
            os.environ.pop("TMPDIR")
        else:
            os.environ["TMPDIR"] = saved
    d.env["OMPI_MCA_btl_tcp_if_include"] = "lo"
    return d, tmp


@pytest.fixture(scope="module", params=list(KINDS))
def kdvm(libpmix, request):
    """(the DVM, its daemon node, its other node), for each kind of DVM."""
    hosts, daemon, other = KINDS[request.param]
    d, base = _dvm(hosts)
    try:
        yield d, daemon, other
    finally:
        d.stop()
        shutil.rmtree(base, ignore_errors=True)


def _publisher(d, node: str, key: str):
    """A job on ``node`` holding ``key``; (its process, reader, namespace)."""
    p = d.run_bg("--host", node, "-n", "1", "sh", "-c",
                 f'echo "NS=$PMIX_NAMESPACE"; exec pydvm publish {key}=fromjob '
                 "--range global --hold 600")
    reader = LineReader(p.stdout)
    ns = reader.wait_line("NS=", timeout=60)[3:]
    reader.wait_line("PUBLISHED", timeout=60)
    return p, ns


def test_queries_lookups_and_pids_reach_the_dvm(kdvm, pmixcc):
    d, daemon, _other = kdvm
    tool = pmixcc("pmix_tool")
    key = f"k{uuid.uuid4().hex[:8]}"
    job, ns = _publisher(d, daemon, key)
    try:
        uri = tool_uri(d)
        # pps: by search of the DVM's TMPDIR, of --pmix-dir, and by URI
        for env in (tool_env(d), tool_env(d, TMPDIR=pmix_dir(d)),
                    tool_env(d, PMIX_SERVER_URI41=uri)):
            p = run_tool(d, "pps", env=env)
            assert p.returncode == 0, p.stderr
            assert active_nspaces(p) == {ns}
        # pattrs naming the master's pid, a daemon's (it runs here), the URI
        for how in (["--pid", str(d.pid)], ["--pid", str(d.daemon_pids[daemon])],
                    ["--uri", uri]):
            p = run_tool(d, "pattrs", *how, "--host-fns")
            assert p.returncode == 0, (how, p.stderr)
            assert re.search(r"HOST SUPPORTED FUNCTIONS:\n\tPMIx_", p.stdout + p.stderr), how
        # a program's PMIx_tool_init naming the master's pid: query, lookup, publish
        p = run_tool(d, tool, f"pid:{d.pid}", "query:pmix.qry.ns", f"lookup:{key}",
                     f"publish:{key}t=v")
        assert re.search(r"^INIT status=0 nspace=pydvm-\w+-tool\.\d+ rank=0$", p.stdout,
                         re.M), p.stdout + p.stderr
        assert f"QUERY status=0 key=pmix.qry.ns value={ns}" in p.stdout, p.stdout
        assert f"LOOKUP status=0 key={key} value=fromjob publisher={ns}:0" in p.stdout
        assert "PUBLISH status=0" in p.stdout, p.stdout
    finally:
        job.terminate()
        finish(job)


def test_pevent_reaches_a_jobs_processes_on_every_node(kdvm, pmixcc):
    d, daemon, other = kdvm
    exe = pmixcc("pmix_events")
    code = -20000 - int(uuid.uuid4().int % 5000)
    job = d.run_bg("--tag-output", "--host", f"{other},{daemon}", "-n", "2", "--map-by",
                   "node", exe, f"register:{code}", "fence", "wait:1:60000")
    reader = LineReader(job.stdout)
    try:
        wait_for(lambda: sum("FENCE status=0" in ln for ln in reader.lines) == 2, timeout=60,
                 what="both ranks registered")
        p = run_tool(d, "pevent", "--event", str(code), "--range", "5")
        assert p.returncode == 0, p.stderr
        assert finish(job) == 0
    finally:
        if job.poll() is None:
            job.terminate()
            finish(job)
    out = reader.join(60)  # the job has ended: every line it wrote, read to EOF
    got = re.findall(rf"^\[\S+,(\d)\] EVENT code={code} source=(pydvm-\w+-tool\.\d+):0 ",
                     "\n".join(out), re.M)
    assert sorted(r for r, _ in got) == ["0", "1"], out


def test_a_debugger_spawns_a_stopped_job_and_releases_it(kdvm, pmixcc, tmp_path):
    """The tool's spawn is its user's job, its release event reaches the job:
    both trusted only from the tool server's own link to the master."""
    d, _daemon, _other = kdvm
    dbg, client = pmixcc("pmix_debugger"), pmixcc("pmix_dbg_client")
    mk = tmp_path / "mk"
    mk.mkdir()
    uri = tool_uri(d)
    a = run_tool(d, dbg, f"uri:{uri}", f"launch:2:{client}:{mk}", "table:2", timeout=60)
    m = re.search(r"^SPAWN status=0 nspace=(\S+)", a.stdout, re.M)
    assert m, a.stdout + a.stderr
    ns = m.group(1)
    hosts = re.findall(r"^PROC rank=\d host=(\S+) .* state=5$", a.stdout, re.M)
    assert len(hosts) == 2, a.stdout
    waiting(d, ns, set(hosts))  # both in PMIx_Init, held there
    assert not list(mk.iterdir())
    b = run_tool(d, dbg, f"uri:{uri}", f"attach:{ns}", "table:2", "release", "waitend",
                 timeout=60)
    assert "RELEASE status=0" in b.stdout and "ENDED status=0 yes" in b.stdout, b.stdout
    assert sorted(f.name for f in mk.iterdir()) == ["init.0", "init.1"]


def test_a_dvm_without_a_head_node_and_without_isolation_serves_tools_in_the_master(
        libpmix, pmixcc):
    """``pydvm_pmix_isolate off``: the master's own libpmix server takes the
    tools (no node lives there); the DVM runs jobs as before."""
    d, base = _dvm("n1:2,n2:2", pydvm_pmix_isolate="off")
    try:
        job, ns = _publisher(d, "n1", f"k{uuid.uuid4().hex[:8]}")
        try:
            p = run_tool(d, "pps")
            assert p.returncode == 0, p.stderr
            assert active_nspaces(p) == {ns}
            p = run_tool(d, pmixcc("pmix_tool"), f"pid:{d.pid}", "query:pmix.qry.ns")
            assert f"QUERY status=0 key=pmix.qry.ns value={ns}" in p.stdout, \
                p.stdout + p.stderr
            info = d.cmd("info", check=True).stdout
            assert re.search(r"PMIx tools attach beside the master \(no head node\) at "
                             r"\S+ \(file ", info), info
        finally:
            job.terminate()
            finish(job)
    finally:
        d.stop()
        shutil.rmtree(base, ignore_errors=True)
