"""The binding's query upcall and its answer to libpmix 4.2.2's attribute query,
with real clients of a harness server (no runtime): what the host is handed,
what the client reads back, and that ``pattrs`` no longer kills the server."""

from __future__ import annotations

import shutil

import pytest

from cbuild import pmix_builder
from pathlib import Path

CLIENTS = Path(__file__).parent / "clients"


@pytest.fixture(scope="module")
def pmix_query(libpmix, tmp_path_factory):
    return pmix_builder(tmp_path_factory.mktemp("q"), CLIENTS)("pmix_query")


def test_a_query_reaches_the_host_and_its_typed_answer_the_client(harness, pmix_query):
    res = harness({"clients": [{"rank": 0, "argv": [
        pmix_query, "pmix.qry.ns", "pmix.qry.ptable@self", "pmix.qry.mem"]}]})
    out = res.clients[0]["stdout"]
    assert res.clients[0]["rc"] == 0, out + res.clients[0]["stderr"]
    assert "QUERY key=pmix.qry.ns status=0 n=1" in out
    assert "VALUE key=pmix.qry.ns type=3 value=a,b" in out
    # the exit code (3) does not cross libpmix 4.2's wire: its packer of
    # pmix_proc_info_t leaves it out, and the client reads 0
    assert ("PROC key=pmix.qry.ptable nspace=pydvm-test@1 rank=7 host=nodeX exe=/bin/prog "
            "pid=4242 exit=0 state=20") in out
    assert "QUERY key=pmix.qry.mem status=-47 n=0" in out
    qs = res.kinds("query")
    # libpmix names its own server, not the client, as the asker
    assert {q["server"] for q in qs} == {"pydvm-server:0"}
    tables = [q for q in qs if q["queries"][0]["keys"] == ["pmix.qry.ptable"]]
    assert tables[0]["queries"][0]["qualifiers"] == {"pmix.nspace": ["pydvm-test@1", 3]}
    assert res.report["pending_replies"] == 0


def test_pattrs_host_functions_answered_without_crashing_the_server(harness):
    if not shutil.which("pattrs"):
        pytest.skip("pattrs not installed (apt-get install libpmix-bin)")
    res = harness({"clients": [{"rank": 0, "argv": ["pattrs", "--host-fns"]},
                               {"rank": 1, "argv": ["pattrs", "--host", "PMIx_Fence"]}]})
    assert res.report["attribute_fix"] == "installed"
    c0, c1 = res.clients[0], res.clients[1]
    assert c0["rc"] == 0 and c1["rc"] == 0, (c0, c1)
    assert "HOST SUPPORTED FUNCTIONS:\n\tPMIx_Abort\n\tPMIx_Fence\n" in c0["stderr"]
    assert "PMIx_Fence:" in c1["stderr"] and "pmix.collect" in c1["stderr"], c1["stderr"]
    assert res.report["stats"]["answered_now"] >= 2
