"""Each lifetime applied to items published through PMIx -- and, the same test, natively.

``publisher`` is how the item is published: ``pmix`` (the C client's
PMIx_Publish with a PMIX_PERSISTENCE directive, or none for the default) or
``native`` (``pydvm publish``).  Every lifetime is ended by the real event
(a process, an application, a job or a session ending; the idle timeout; a
first read; the byte cap) and checked with ``pydvm lookup``.
"""

from __future__ import annotations

import pytest

from pmixkit import CLIENTS, FAR, HEAD, statuses
from dvmkit import lines, status

PUBLISHERS = ["pmix", "native"]
PERSIST = {"indef": 0, "first-read": 1, "proc": 2, "app": 3, "session": 4, "nspace": 5}


def publish(kind: str, pmix_ops: str, key: str, persistence: str | None, hold: float = 0):
    """argv of a process that publishes ``key``=v with ``persistence`` (None: the
    default) and stays alive ``hold`` seconds."""
    if kind == "pmix":
        op = (f"pubd:persist=persist/{PERSIST[persistence]}:{key}:string:v" if persistence
              else f"pub:{key}:string:v")
        return [pmix_ops, op, f"sleep:{int(hold * 1000)}"]
    argv = ["pydvm", "publish", f"{key}=v", "--hold", str(hold)]
    return argv + (["--persistence", persistence] if persistence else [])


def look(key: str, delay: float = 0, wait: bool = False) -> list[str]:
    w = f"--wait --timeout 20 " if wait else ""
    return ["sh", "-c", f"sleep {delay}; pydvm lookup {key} {w}"]


def statuses_of(p) -> list[str]:
    return [ln.split()[1] for ln in lines(p, "STATUS ")]


@pytest.mark.parametrize("kind", PUBLISHERS)
def test_proc_item_goes_with_its_process_while_the_job_runs_on(pdvm, pmix_ops, kind):
    key = f"proc-{kind}"
    p = pdvm.run("--host", HEAD, "-n", "1", *publish(kind, pmix_ops, key, "proc", hold=1.5),
                 ":", "--host", FAR, "-n", "1", "sh", "-c",
                 f"pydvm lookup {key} --wait --timeout 20; sleep 3; pydvm lookup {key}")
    assert statuses_of(p)[-2:] == ["PMIX_SUCCESS", "PMIX_ERR_NOT_FOUND"], p.stdout + p.stderr


@pytest.mark.parametrize("kind", PUBLISHERS)
def test_app_item_goes_with_its_application_in_mpmd_while_another_runs(pdvm, pmix_ops, kind):
    key = f"app-{kind}"
    p = pdvm.run("--host", FAR, "-n", "1", *publish(kind, pmix_ops, key, "app", hold=1.0), ":",
                 "--host", HEAD, "-n", "1", "sh", "-c",
                 f"pydvm lookup {key} --wait --timeout 20; sleep 3; pydvm lookup {key}")
    assert statuses_of(p)[-2:] == ["PMIX_SUCCESS", "PMIX_ERR_NOT_FOUND"], p.stdout + p.stderr


@pytest.mark.parametrize("kind", PUBLISHERS)
def test_an_item_without_persistence_is_nspace_and_goes_with_its_job(pdvm, pmix_ops, kind):
    """No persistence given: NSPACE (SPEC) -- it outlives its process, not its job."""
    key = f"ns-{kind}"
    p = pdvm.run("--host", FAR, "-n", "1", *publish(kind, pmix_ops, key, None), ":",
                 "--host", HEAD, "-n", "1", *look(key, delay=1.5))
    assert statuses_of(p) [-1] == "PMIX_SUCCESS", p.stdout + p.stderr
    q = pdvm.run("--host", HEAD, "-n", "1", "pydvm", "lookup", key)
    assert status(q) == "PMIX_ERR_NOT_FOUND"


@pytest.mark.parametrize("kind", PUBLISHERS)
def test_session_item_outlives_its_job_and_goes_with_its_session(pdvm, pmix_ops, kind):
    sid = pdvm.cmd("session", "new", check=True).stdout.strip()
    key = f"sess-{kind}"
    p = pdvm.run("--session", sid, "--host", FAR, "-n", "1",
                 *publish(kind, pmix_ops, key, "session"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert status(pdvm.run("--session", sid, "-n", "1", "pydvm", "lookup", key)) == \
        "PMIX_SUCCESS"
    pdvm.cmd("session", "end", sid, check=True)
    assert status(pdvm.run("-n", "1", "pydvm", "lookup", key)) == "PMIX_ERR_NOT_FOUND"


@pytest.mark.parametrize("kind", PUBLISHERS)
def test_first_read_item_is_handed_to_a_later_mpi_job_and_consumed(pdvm, pmix_ops, kind,
                                                                   mpi4py_python):
    """Job 1 publishes FIRST_READ and ends; an mpi4py job (MPI_Lookup_name) reads it;
    the next finds nothing (MPI_ERR_NAME)."""
    key = f"fr-{kind}"
    p = pdvm.run("--host", HEAD, "-n", "1", *publish(kind, pmix_ops, key, "first-read"))
    assert p.returncode == 0, p.stdout + p.stderr
    script = str(CLIENTS / "mpi4py_names.py")
    q = pdvm.run("--host", FAR, "-n", "1", mpi4py_python, script, f"look:{key}")
    assert f"FOUND {key} v" in q.stdout, q.stdout + q.stderr
    r = pdvm.run("--host", HEAD, "-n", "1", mpi4py_python, script, f"look:{key}")
    assert f"LOOK {key} class=38" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("kind", PUBLISHERS)
def test_indef_item_goes_after_the_idle_timeout(make_pdvm, pmix_ops, kind):
    d = make_pdvm(prte_data_server_timeout="2")
    key = f"idle-{kind}"
    assert d.run("--host", FAR, "-n", "1", *publish(kind, pmix_ops, key, "indef")).returncode == 0
    p = d.run("--host", HEAD, "-n", "1", "sh", "-c",
              f"pydvm lookup {key}; sleep 4.5; pydvm lookup {key}")
    assert statuses_of(p) == ["PMIX_SUCCESS", "PMIX_ERR_NOT_FOUND"], p.stdout + p.stderr
    assert d.store()["master"]["expiries"] == 1


def test_the_cap_evicts_the_oldest_items_whichever_client_published_them(make_pdvm, pmix_ops):
    """One uid at the cap: a PMIx publish evicts the native client's oldest item, and a
    native publish the PMIx client's."""
    d = make_pdvm(prte_data_server_max_size="600")
    p = d.run("--host", FAR, "-n", "1", "pydvm", "publish", f"cap-n1={'a' * 300}",
              "--persistence", "indef")
    assert status(p) == "PMIX_SUCCESS"
    q = d.run("--host", HEAD, "-n", "1", pmix_ops, f"pubd:persist=persist/0:cap-p1:string:{'b' * 300}")
    assert statuses(q.stdout, "PUBLISH") == [0], q.stdout
    assert status(d.run("-n", "1", "pydvm", "lookup", "cap-n1")) == "PMIX_ERR_NOT_FOUND"
    r = d.run("--host", FAR, "-n", "1", "pydvm", "publish", f"cap-n2={'c' * 300}",
              "--persistence", "indef")
    assert status(r) == "PMIX_SUCCESS"
    assert status(d.run("-n", "1", "pydvm", "lookup", "cap-p1")) == "PMIX_ERR_NOT_FOUND"
    assert d.store()["master"]["evictions"] == 2
