"""PMIx tools from outside any job, attached to a real DVM's head node server.

OpenPMIx 4.2.2's own tools (Debian's libpmix-bin) and a C tool of ours
(clients/pmix_tool.c: ``PMIx_tool_init``, then publish / lookup / query /
notify) run as plain subprocesses, not as jobs.  What each prints for a
correct answer is read from its 4.2.2 source (src/tools/*/*.c): ``pps``
prints ``Active nspaces: <PMIX_QUERY_NAMESPACES>`` on stderr; ``pattrs
--host-fns`` prints ``HOST SUPPORTED FUNCTIONS:`` and one tab-indented
function per line; ``pevent --event CODE --range R`` prints nothing and
exits 0 once ``PMIx_Notify_event`` completed.  ``pquery`` and ``plookup``
crash in 4.2.2 whatever the server does (SIGFPE before connecting; SIGSEGV
on a NULL key list) -- checked here, so that a fixed libpmix-bin shows up.

The DVM runs with a private ``TMPDIR``, so that the rendezvous files a
tool searches for without options are this DVM's only.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from pmixkit import FAR, HEAD
from dvmkit import LineReader, finish, start_dvm, wait_for


def _private_dvm(**mca):
    """(DVM with a head node and daemon node ``far`` whose TMPDIR is its own, base dir)."""
    for t in ("pps", "pattrs", "pevent"):
        if not shutil.which(t):
            pytest.skip(f"{t} not installed (apt-get install libpmix-bin)")
    base = tempfile.mkdtemp(prefix="ptools")
    tmpdir = os.path.join(base, "tmp")
    os.makedirs(tmpdir)
    saved = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = tmpdir
    try:
        d = start_dvm(Path(base), f"{HEAD}:4,{FAR}:4",
                      {"pydvm_pmix": "on", **{"pydvm_pmix_isolate": "auto", **mca}})
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    finally:
        if saved is None:
            os.environ.pop("TMPDIR")
        else:
            os.environ["TMPDIR"] = saved
    d.env["OMPI_MCA_btl_tcp_if_include"] = "lo"
    return d, base


@pytest.fixture(scope="module", params=["auto", "off"])
def tdvm(libpmix, request):
    """The DVM the tools attach to: "auto" -- a `pydvm start` DVM's default --
    serves them in a tool server process of the head node; "off" in the
    head node's own server (the master's process)."""
    d, base = _private_dvm(pydvm_pmix_isolate=request.param)
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(base, ignore_errors=True)


def tool_uri(d) -> str:
    p = d.cmd("info", "--pmix-uri", check=True)
    uri = p.stdout.strip()
    assert re.fullmatch(r"\S+\.0;tcp4?://127\.0\.0\.1:\d+", uri), uri
    return uri


def pmix_dir(d) -> str:
    p = d.cmd("info", "--pmix-dir", check=True)
    path = p.stdout.strip()
    assert os.path.isfile(os.path.join(path, "tool.uri")), path
    return path


def tool_env(d, **extra) -> dict[str, str]:
    """A tool's environment: the DVM's TMPDIR, no job's PMIx variables."""
    e = {k: v for k, v in d.env.items() if not k.startswith(("PMIX_", "PYDVM_"))}
    e.update(extra)
    return e


def run_tool(d, *argv, env=None, timeout=30) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), env=env or tool_env(d), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def active_nspaces(p: subprocess.CompletedProcess) -> set[str]:
    m = re.search(r"^Active nspaces: (.*)$", p.stderr, re.M)
    assert m, (p.returncode, p.stdout, p.stderr)
    return {n for n in m.group(1).split(",") if n}


def connected(d) -> int:
    m = re.search(r"PMIx tools attach .*; (\d+) connected", d.cmd("info", check=True).stdout)
    assert m
    return int(m.group(1))


@pytest.fixture
def sleeper(tdvm):
    """A job on the daemon node; yields its namespace."""
    p = tdvm.run_bg("--host", FAR, "-n", "1", "sh", "-c",
                    'echo "NS=$PMIX_NAMESPACE"; exec sleep 600')
    reader = LineReader(p.stdout)
    try:
        yield reader.wait_line("NS=", timeout=60)[3:]
    finally:
        p.terminate()
        finish(p)


def test_pps_from_outside_by_uri_and_by_search(tdvm, sleeper):
    uri = tool_uri(tdvm)
    p = run_tool(tdvm, "pps", env=tool_env(tdvm, PMIX_SERVER_URI41=uri))
    assert p.returncode == 0, p.stderr
    assert "pps: querying nspaces" in p.stderr
    assert active_nspaces(p) == {sleeper}
    # without anything: the rendezvous files libpmix searches TMPDIR for --
    # the DVM's TMPDIR, or the directory `pydvm info --pmix-dir` names
    for env in (tool_env(tdvm), tool_env(tdvm, TMPDIR=pmix_dir(tdvm))):
        p = run_tool(tdvm, "pps", env=env)
        assert p.returncode == 0, p.stderr
        assert active_nspaces(p) == {sleeper}


def test_pattrs_by_pid_namespace_and_uri_file(tdvm):
    uri = tool_uri(tdvm)
    server_ns = uri.split(";")[0].rsplit(".", 1)[0]
    uri_file = re.search(r"\(file (\S+);", tdvm.cmd("info", check=True).stdout).group(1)
    # (the far node's daemon runs here too: its pid leads to the head node, as the master's)
    for how in (["--pid", str(tdvm.pid)], ["--pid", str(tdvm.daemon_pids[FAR])],
                ["--namespace", server_ns], ["--uri", uri],
                ["--uri", f"file:{uri_file}"]):
        p = run_tool(tdvm, "pattrs", *how, "--host-fns")
        assert p.returncode == 0, (how, p.stdout, p.stderr)
        out = p.stdout + p.stderr  # pattrs 4.2.2 prints to stderr
        fns = re.search(r"HOST SUPPORTED FUNCTIONS:\n((?:\t\S+\n)+)", out)
        assert fns, (how, p.stdout, p.stderr)
        assert {"PMIx_Query_info", "PMIx_Lookup", "PMIx_Publish"} <= \
            set(fns.group(1).split()), how
    p = run_tool(tdvm, "pattrs", "--uri", uri, "--host", "PMIx_Lookup")
    assert p.returncode == 0, p.stderr
    out = p.stdout + p.stderr
    assert "PMIx_Lookup:" in out and re.search(r"^PMIX_WAIT\s+pmix\.wait", out, re.M), out


def test_pquery_and_plookup_of_422_crash_and_the_dvm_lives_on(tdvm, sleeper):
    uri = tool_uri(tdvm)
    env = tool_env(tdvm, PMIX_SERVER_URI41=uri)
    p = run_tool(tdvm, "pquery", "--uri", uri, "pmix.qry.ns", env=env)
    if p.returncode != -signal.SIGFPE:
        pytest.fail(f"pquery no longer dies of SIGFPE ({p.returncode}): a fixed libpmix-bin? "
                    f"check its answer and docs/pmix.md\n{p.stdout}{p.stderr}")
    if shutil.which("plookup"):
        p = run_tool(tdvm, "plookup", "somekey", env=env)
        assert p.returncode == -signal.SIGSEGV, (p.returncode, p.stderr)
    p = run_tool(tdvm, "pps", env=env)
    assert active_nspaces(p) == {sleeper}


def test_a_tool_looks_up_publishes_and_its_keys_end_with_it(tdvm, pmixcc):
    tool = pmixcc("pmix_tool")
    uri = tool_uri(tdvm)
    key = f"k{uuid.uuid4().hex[:8]}"
    pub = tdvm.run_bg("--host", FAR, "-n", "1", "sh", "-c",
                      f'echo "NS=$PMIX_NAMESPACE"; exec pydvm publish {key}=fromjob '
                      '--range global --hold 600')
    reader = LineReader(pub.stdout)
    try:
        job_ns = reader.wait_line("NS=", timeout=60)[3:]
        reader.wait_line("PUBLISHED", timeout=60)
        p = run_tool(tdvm, tool, f"uri:{uri}", f"lookup:{key}", "lookup:nosuchkey",
                     f"publish:{key}t=v-ns", f"publish:{key}s=v-session:4:4",
                     f"publish:{key}p=v-proc:4:2", "waitlookup:nosuchkey:1")
        assert p.returncode == 0, p.stderr
        init = re.search(r"^INIT status=0 nspace=(\S+) rank=0$", p.stdout, re.M)
        assert init, p.stdout
        me = init.group(1)
        assert re.fullmatch(r"pydvm-\w+-tool\.\d+", me), me
        assert f"LOOKUP status=0 key={key} value=fromjob publisher={job_ns}:0" in p.stdout
        assert "LOOKUP status=-46 key=nosuchkey" in p.stdout       # NOT_FOUND
        assert p.stdout.count("PUBLISH status=0") == 3
        assert "LOOKUP status=-24 key=nosuchkey" in p.stdout       # TIMEOUT after 1 s
        # the tool has gone: its NSPACE and PROC items went with it, SESSION stays
        wait_for(lambda: connected(tdvm) == 0, what="the tool's departure")
        q = tdvm.run("--host", FAR, "-n", "1", "pydvm", "lookup", f"{key}s")
        assert q.returncode == 0, q.stdout
        assert f"FOUND {key}s v-session from {me}:0" in q.stdout, q.stdout
        for gone in (f"{key}t", f"{key}p"):
            q = tdvm.run("--host", HEAD, "-n", "1", "pydvm", "lookup", gone)
            assert q.returncode == 1 and "PMIX_ERR_NOT_FOUND" in q.stdout, (gone, q.stdout)
        # the tool's SESSION item is the tool's uid's: another tool may remove it
        p = run_tool(tdvm, tool, f"uri:{uri}", f"unpublish:{key}s", f"lookup:{key}s")
        assert "UNPUBLISH status=0" in p.stdout and f"LOOKUP status=-46 key={key}s" in p.stdout
    finally:
        pub.terminate()
        finish(pub)


def _pevent_to_a_job_on_both_nodes(d, pmixcc) -> list[tuple[str, str]]:
    """A job of one rank per node registers for a fresh code; ``pevent`` from
    outside raises it (range 5: global).  Each (rank, source) that got it."""
    exe = pmixcc("pmix_events")
    code = -20000 - int(uuid.uuid4().int % 5000)
    job = d.run_bg("--tag-output", "--host", f"{HEAD},{FAR}", "-n", "2", "--map-by", "node",
                   exe, f"register:{code}", "fence", "wait:1:60000")
    reader = LineReader(job.stdout)
    try:
        wait_for(lambda: sum("FENCE status=0" in ln for ln in reader.lines) == 2, timeout=60,
                 what="both ranks registered")
        # (with PMIX_SERVER_URI41 a 4.2.2 tool presents itself as a job's
        # client of no namespace: it gets no identity, and its event no source)
        p = run_tool(d, "pevent", "--event", str(code), "--range", "5",
                     env=tool_env(d, TMPDIR=pmix_dir(d)))
        assert p.returncode == 0, p.stderr
        assert finish(job) == 0
    finally:
        if job.poll() is None:
            job.terminate()
            finish(job)
    out = "\n".join(reader.join(60))  # the job has ended: read to EOF
    got = re.findall(rf"^\[\S+,(\d)\] EVENT code={code} source=(\S+):0 ", out, re.M)
    assert got, out
    return got


def test_pevent_reaches_the_processes_that_registered(tdvm, pmixcc):
    got = _pevent_to_a_job_on_both_nodes(tdvm, pmixcc)
    assert {r for r, _ in got} == {"0", "1"}, got
    assert all(re.fullmatch(r"pydvm-\w+-tool\.\d+", s) for _, s in got), got


def test_pevent_reaches_processes_served_by_a_pmix_server_of_their_own(libpmix, pmixcc):
    """With ``pydvm_pmix_isolate=on`` the job's processes on the head node are
    served by a server process of their own, not by the head node's server
    the tool attached to (whose libpmix delivers only to its own clients):
    the master passes the event back to the origin node's other servers."""
    d, base = _private_dvm(pydvm_pmix_isolate="on")
    try:
        got = _pevent_to_a_job_on_both_nodes(d, pmixcc)
        assert sorted(r for r, _ in got) == ["0", "1"], got  # each rank once, the head node's too
    finally:
        d.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a tool as another uid")
def test_a_tool_of_another_uid_claiming_one_or_naming_a_process_is_refused(tdvm, pmixcc,
                                                                           sleeper):
    """Each refusal cuts the tool's connection in its handshake: its
    PMIx_tool_init fails (libpmix 4.2.2's own refusal would crash the server);
    the DVM and its owner's tools carry on."""
    tool = pmixcc("pmix_tool")
    pub = tempfile.mkdtemp(prefix="ptoolx")
    os.chmod(pub, 0o755)
    try:
        exe = shutil.copy(tool, pub)
        shim = os.path.join(pub, "claim0.so")
        src = os.path.join(pub, "claim0.c")
        with open(src, "w") as f:
            f.write("#include <sys/types.h>\nuid_t geteuid(void){return 0;}\n"
                    "gid_t getegid(void){return 0;}\n")
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", shim, src], check=True)
        os.chmod(exe, 0o755)
        os.chmod(shim, 0o755)
        uri = tool_uri(tdvm)
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        lie = ["env", f"LD_PRELOAD={shim}"]
        cases = {
            "is not the DVM's owner": [*nobody, exe, f"uri:{uri}", "lookup:x"],
            "claims uid 0 but is uid 65534": [*nobody, *lie, exe, f"uri:{uri}", "lookup:x"],
            # a "client tool" naming a running process of the owner's job
            "claims uid 0 but is uid 65534 ": [*nobody, *lie, f"PMIX_NAMESPACE={sleeper}",
                                               "PMIX_RANK=0", f"PMIX_SERVER_URI41={uri}",
                                               exe, "search", "lookup:x"],
            # a client tool (libpmix keeps its name) naming no process of its own
            "names itself nosuch:0": ["env", "PMIX_NAMESPACE=nosuch", "PMIX_RANK=0",
                                      f"PMIX_SERVER_URI41={uri}", exe, "search", "lookup:x"],
        }
        for why, argv in cases.items():
            before = tdvm.log("master").count(why.strip())
            p = run_tool(tdvm, *argv)
            assert p.returncode == 1, (why, p.stdout, p.stderr)
            assert re.search(r"^INIT status=-\d+ nspace=-", p.stdout, re.M), (why, p.stdout)
            assert "LOOKUP" not in p.stdout
            assert tdvm.log("master").count(why.strip()) == before + 1, why
        p = run_tool(tdvm, exe, f"uri:{uri}", "query:pmix.qry.ns")
        assert f"QUERY status=0 key=pmix.qry.ns value={sleeper}" in p.stdout, p.stdout
        # a tool that merely gives itself a name (PMIX_TOOL_NSPACE) is known
        # by the host's: it acts as a tool of its uid, not as that process
        p = run_tool(tdvm, exe, f"uri:{uri}", f"as:{sleeper}:0", "publish:asname=1",
                     "lookup:asname")
        assert re.search(rf"LOOKUP status=0 key=asname value=1 "
                         rf"publisher=pydvm-\w+-tool\.\d+:0", p.stdout), p.stdout
    finally:
        shutil.rmtree(pub, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="the system server is root's")
def test_the_system_server_file_is_written_only_when_asked(tdvm, libpmix):
    sysfile = os.path.join(tdvm.env["TMPDIR"], f"pmix.sys.{os.uname().nodename}")
    assert not os.path.exists(sysfile)        # off by default
    d, base = _private_dvm(pydvm_pmix_system_server="on")
    try:
        sysfile = os.path.join(d.env["TMPDIR"], f"pmix.sys.{os.uname().nodename}")
        assert os.stat(sysfile).st_mode & 0o777 == 0o644
        with open(sysfile) as f:
            assert f.readline().strip() == tool_uri(d)
        p = run_tool(d, "pps")
        assert p.returncode == 0 and active_nspaces(p) == set(), p.stderr
    finally:
        d.stop()
    try:
        assert not os.path.exists(sysfile)    # gone with the DVM
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_tool_started_with_a_clients_uri_variable_is_served_queries_only(tdvm, pmixcc):
    """libpmix 4.2.2: PMIX_SERVER_URI41 in a tool's environment makes it a
    "client tool" of an empty namespace; libpmix keeps that name instead of
    the one the host gives, so nothing but queries can be answered as it."""
    tool = pmixcc("pmix_tool")
    p = run_tool(tdvm, tool, "search", "lookup:x", "publish:a=b", "query:pmix.qry.ns",
                 env=tool_env(tdvm, PMIX_SERVER_URI41=tool_uri(tdvm)))
    assert re.search(r"^INIT status=0 nspace= rank=", p.stdout, re.M), p.stdout
    assert "LOOKUP status=-23" in p.stdout and "PUBLISH status=-23" in p.stdout, p.stdout
    assert "QUERY status=0 key=pmix.qry.ns" in p.stdout, p.stdout


def test_a_daemons_server_lets_in_only_its_own_users_client_tools(tdvm, pmixcc):
    """Daemon nodes serve no tools: libpmix would let a tool in under the
    identity it gives itself, so the binding cuts every tool there except a
    job's process started as a tool (PMIX_NAMESPACE/PMIX_RANK, its uid the
    kernel's): ``pydvm run pps`` keeps working on every node."""
    tool = pmixcc("pmix_tool")
    key = f"d{uuid.uuid4().hex[:8]}"
    job = tdvm.run_bg("--host", FAR, "-n", "1", "sh", "-c",
                      'echo "NS=$PMIX_NAMESPACE"; echo "URI=$PMIX_SERVER_URI41"; '
                      f"exec pydvm publish {key}=v --hold 600")
    reader = LineReader(job.stdout)
    try:
        ns = reader.wait_line("NS=", timeout=60)[3:]
        far_uri = reader.wait_line("URI=", timeout=60)[4:]
        reader.wait_line("PUBLISHED", timeout=60)
        for how in ([f"uri:{far_uri}"], [f"uri:{far_uri}", f"as:{ns}:0"]):
            p = run_tool(tdvm, tool, *how, f"lookup:{key}")
            assert p.returncode == 1 and "INIT status=-25" in p.stdout, (how, p.stdout)
        p = run_tool(tdvm, tool, "search", f"lookup:{key}",
                     env=tool_env(tdvm, PMIX_NAMESPACE=ns, PMIX_RANK="0",
                                  PMIX_SERVER_URI41=far_uri))
        assert f"LOOKUP status=0 key={key} value=v publisher={ns}:0" in p.stdout, p.stdout
        assert "this server serves no tools" in tdvm.log(FAR)
    finally:
        job.terminate()
        finish(job)


def test_a_crash_inside_libpmix_from_a_tool_outside_ends_only_the_tool_server(libpmix, pmixcc):
    """Tools from outside attach to a server process of their own on a DVM
    ``pydvm start`` started (``pydvm_pmix_isolate`` auto): a tool that crashes
    libpmix there (4.2.2's attribute query, the fix off) ends that process
    only -- not the master, not a job's process connected to the head node's
    other server -- and a new tool server takes tools again, at a new URI."""
    from pydvm.pmix import _lib as L
    from pydvm.pmix.queries import affected
    if not affected(L.parse_version(L.load().version)):
        pytest.skip("this libpmix answers attribute queries without crashing")
    d, base = _private_dvm(pydvm_pmix_attribute_fix="off")
    served = None
    try:
        served = d.run_bg("--host", HEAD, "-n", "1", pmixcc("pmix_events"), "sleep:600000")
        assert LineReader(served.stdout).wait_line("INIT", timeout=60) == "INIT status=0 rank=0"
        uri = tool_uri(d)
        crash = run_tool(d, "pattrs", "--uri", uri, "--host-fns")
        assert "HOST SUPPORTED FUNCTIONS:" not in crash.stdout + crash.stderr
        assert crash.returncode != 0

        def new_uri():
            p = d.cmd("info", "--pmix-uri")
            return p.returncode == 0 and p.stdout.strip() not in ("", uri) and p.stdout.strip()
        again = wait_for(new_uri, timeout=60, what="a new tool server")
        os.kill(d.pid, 0)
        assert served.poll() is None
        p = run_tool(d, "pps", env=tool_env(d, PMIX_SERVER_URI41=again))
        assert p.returncode == 0, p.stderr
        assert len(active_nspaces(p)) == 1
        # found by search too: the files name the new server only
        p = run_tool(d, "pps", env=tool_env(d, TMPDIR=pmix_dir(d)))
        assert p.returncode == 0, p.stderr
        assert len(active_nspaces(p)) == 1
        log = d.log("master")
        assert re.search(r"PMIx tool server \(pid \d+\) ended \(killed by signal SIGSEGV\)",
                         log), log[-3000:]
    finally:
        if served is not None:
            if served.poll() is None:
                served.terminate()
            finish(served)
        d.stop()
        shutil.rmtree(base, ignore_errors=True)
