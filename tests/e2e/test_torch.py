"""pydvm as PyTorch's store and rendezvous, with real torch (CPU, gloo) in real jobs.

The job programs are ``jobs/torch_store.py``: each rule of torch's Store
contract is checked inside a job and reported as a ``RULE`` line, so a
failure names the rule.  Jobs run on two nodes (local daemons a and b; a
daemon node's client takes the direct path to the master).  After each job
its keys must be gone from every store of the DVM (``pydvm store --json``),
whether the job ended well, without ``destroy_process_group``, or with a
rank killed.

Skipped, with the reason, where torch cannot be imported (CI installs the
CPU build: .ci/run).
"""

from __future__ import annotations

import json
import sys

import pytest

from dvmkit import finish, job_script, start_dvm

pytest.importorskip("torch.distributed", reason="PyTorch is not installed (pip install "
                    "'pydvm[torch]'; .ci/run installs torch 2.13.0 CPU)")

pytestmark = pytest.mark.e2e

TORCH_JOB = job_script("torch_store")


def rules(out: str) -> dict[str, str]:
    got = {}
    for ln in out.splitlines():
        if ln.startswith("RULE "):
            name, _, verdict = ln[5:].rpartition(" ok") if ln.endswith(" ok") else \
                ln[5:].partition(" FAIL ")
            got[name] = "ok" if ln.endswith(" ok") else verdict
    return got


def assert_rules(p, expected: set[str]) -> None:
    got = rules(p.stdout)
    failed = {k: v for k, v in got.items() if v != "ok"}
    assert not failed, f"rules failed: {failed}\n{p.stdout}\n{p.stderr}"
    assert set(got) == expected, (set(got) ^ expected, p.stdout, p.stderr)


def torch_keys(dvm) -> dict[str, list[str]]:
    """Keys under torch/ in each store of the DVM (this user's, as ``pydvm store`` lists)."""
    out = dvm.cmd("store", "--json", check=True).stdout
    return {s["store"]: [k for k in s["keys"] if k.startswith("torch/")]
            for s in json.loads(out)["stores"]}


def assert_no_torch_keys(dvm) -> None:
    left = {name: keys for name, keys in torch_keys(dvm).items() if keys}
    assert not left, f"keys left in the DVM after the job: {left}"


@pytest.fixture(scope="module")
def tdvm(tmp_path_factory):
    """One DVM (nodes a, b) for the module's jobs; each job leaves nothing."""
    d = start_dvm(tmp_path_factory.mktemp("torch"), "a,b")
    try:
        yield d
    finally:
        d.stop()


CONTRACT = {
    "set overwrites, get returns bytes", "set takes str from Python", "empty key",
    "get times out with DistStoreError naming timeout and key", "add makes the counter",
    "add adds and returns the new value", "add keeps decimal text",
    "add to a non-numeric value raises",
    "cas absent, non-empty expected: returns expected, stores nothing",
    "cas absent, empty expected: stores and returns desired",
    "cas wrong expected: returns current", "cas right expected: stores and returns desired",
    "wait with a timeout raises DistStoreError", "wait with timeout 0 waits without limit",
    "wait without a timeout uses the store's", "check", "getNumKeys counts the store's keys",
    "deleteKey returns whether it removed", "append", "multi_set / multi_get",
    "has_extended_api", "clone survives garbage collection and shares the keys",
    "a Python clone is a PydvmStore on the same keys",
    "a temporary store survives gc; new_group works",
}


@pytest.mark.parametrize("node", ["a", "b"])
def test_every_rule_of_the_store_contract_holds_in_one_process(tdvm, node):
    """Each rule of torch's Store contract, called as C++ calls it (through
    a PrefixStore) and from Python; the job's keys are gone afterwards."""
    p = tdvm.run("--host", node, "-n", "1", *TORCH_JOB, "contract", timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert_rules(p, CONTRACT)
    assert_no_torch_keys(tdvm)


def test_ranks_on_two_nodes_block_count_and_race_through_one_store(tdvm):
    """4 ranks on 2 nodes: a get blocked until another rank's set; 4 x 50
    concurrent adds return exactly 1..200; one compare_set winner, seen by all."""
    p = tdvm.run("--host", "a:2,b:2", "-n", "4", *TORCH_JOB, "ranks", timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert_rules(p, {"a blocking get is released by another rank's set"})
    added = sorted(int(v) for ln in p.stdout.splitlines() if ln.startswith("ADDED")
                   for v in ln.split()[1:])
    assert added == list(range(1, 201)), added
    cas = [ln.split()[1] for ln in p.stdout.splitlines() if ln.startswith("CAS")]
    assert len(cas) == 4 and len(set(cas)) == 1 and cas[0].startswith("rank"), cas
    finals = {ln for ln in p.stdout.splitlines() if ln.startswith("FINAL")}
    assert finals == {f"FINAL 200 {cas[0]}"}, finals
    assert_no_torch_keys(tdvm)


@pytest.mark.parametrize("how", ["store", "url"])
def test_a_4_rank_process_group_all_reduces_barriers_and_makes_subgroups(tdvm, how):
    """init_process_group with a temporary PydvmStore (or init_method="pydvm://"),
    gc, all_reduce, barrier, new_group; keys existed during the job, none after."""
    p = tdvm.run("--host", "a:2,b:2", "-n", "4", *TORCH_JOB, "pg", how, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    sums = sorted(ln for ln in p.stdout.splitlines() if ln.startswith("SUM"))
    assert sums == ["SUM 0 10.0 2.0", "SUM 1 10.0 1.0", "SUM 2 10.0 2.0", "SUM 3 10.0 1.0"], \
        p.stdout
    numkeys = {int(ln.split()[1]) for ln in p.stdout.splitlines() if ln.startswith("NUMKEYS")}
    assert len(numkeys) >= 1 and min(numkeys) > 0, p.stdout
    assert_no_torch_keys(tdvm)


@pytest.mark.parametrize("end", ["nodestroy", "crash"])
def test_a_jobs_keys_go_when_it_ends_without_destroy_or_with_a_rank_killed(tdvm, end):
    p = tdvm.run("--host", "a:2,b:2", "-n", "4", *TORCH_JOB, "pg", "store", end, timeout=120)
    if end == "crash":
        assert p.returncode != 0 and "signal SIGKILL" in p.stderr, p.stdout + p.stderr
    else:
        assert p.returncode == 0, p.stdout + p.stderr
    assert len([ln for ln in p.stdout.splitlines() if ln.startswith("SUM")]) == 4, p.stdout
    assert_no_torch_keys(tdvm)


def test_two_concurrent_jobs_using_the_same_key_names_do_not_see_each_other(tdvm):
    jobs = [tdvm.run_bg("--host", "a:1,b:1", "-n", "2", *TORCH_JOB, "isolated", tag)
            for tag in ("first", "second")]
    outs = []
    for j in jobs:
        assert finish(j, 120) == 0, j.stderr.read()
        outs.append(j.stdout.read())
    for tag, out in zip(("first", "second"), outs):
        seen = sorted(ln for ln in out.splitlines() if ln.startswith("SEEN"))
        assert seen == [f"SEEN {tag} {tag} 2 4"] * 2, (tag, out)
    assert_no_torch_keys(tdvm)


def test_a_set_refused_by_the_store_is_raised_by_the_next_call_and_by_flush(tmp_path):
    with start_dvm(tmp_path, "a", {"prte_data_server_max_size": "64k"}) as d:
        p = d.run("-n", "1", *TORCH_JOB, "refused", timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        assert_rules(p, {"a refused set is raised by the next call", "... once",
                         "flush raises a refused set"})


@pytest.mark.parametrize("share", ["default", "disabled"])
def test_torchrun_with_the_pydvm_backend_rendezvouses_agents_and_workers(tdvm, share):
    """Two torchrun agents (one per node) meet through pydvm's elastic backend,
    found by torchrun's entry point (the agents never import pydvm); their 4
    workers' store is pydvm's too, whatever TORCH_DISABLE_SHARE_RDZV_TCP_STORE
    says; nothing is left once the job ends."""
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} if share == "disabled" else {}
    p = tdvm.run("--host", "a:1,b:1", "-n", "2", *torchrun, "--nnodes", "2",
                 "--nproc-per-node", "2", "--rdzv-backend", "pydvm", "--rdzv-id", "t1",
                 TORCH_JOB[1], "elastic", timeout=240, env=env)  # torchrun runs it with python
    assert p.returncode == 0, p.stdout + p.stderr
    workers = sorted(ln for ln in p.stdout.splitlines() if ln.startswith("WORKER"))
    assert workers == [f"WORKER {r} 4 6.0 job:elastic/t1/round-0 PydvmStore False"
                       for r in range(4)], p.stdout + p.stderr
    assert_no_torch_keys(tdvm)


def test_a_store_outside_a_job_or_with_a_bad_scope_is_a_clear_error(monkeypatch):
    import torch.distributed as dist

    from pydvm.errors import UnreachableError
    from pydvm.torch import PydvmStore

    for var in ("PYDVM_SERVER", "PYDVM_NSPACE", "PYDVM_RANK", "PYDVM_JOB_SIZE", "RANK",
                "WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(UnreachableError, match="not inside a pydvm job"):
        PydvmStore()
    with pytest.raises(ValueError, match="scope must be one of job, session, dvm"):
        PydvmStore(scope="cluster")
    with pytest.raises(ValueError, match="no rank or world size"):
        next(dist.rendezvous("pydvm://"))


# -- PydvmStore beside TCPStore: the behaviours torch's own Store tests check -------

PARITY_JOB = job_script("torch_parity")

#: Each case of jobs/torch_parity.py, run on a PydvmStore of the job and on a
#: TCPStore served in the same process; "prefix:" cases go through torch's
#: C++ PrefixStore over each.
PARITY = {
    "counters_values_and_key_count", "compare_set_rules", "wait_times_out_then_works",
    "get_timeout_wording_and_the_store_still_works", "append_makes_and_extends",
    "multi_set_and_multi_get", "a_clone_sees_the_same_keys",
    "list_keys_lists_the_keys_not_the_queues",
    "a_wait_in_one_thread_is_released_by_a_set_in_another",
    "a_signal_to_a_waiting_thread_does_not_break_its_wait",
    "queue_fifo_len_check_wait", "queue_pop_without_blocking",
    "queue_pop_times_out_in_tcpstore_words", "queues_both_ways_between_two_threads",
    "a_key_and_a_queue_of_one_name_live_side_by_side", "empty_values_and_many_items_in_order",
    "pops_waiting_are_served_in_order_and_a_wait_sees_a_push",
    *(f"prefix:{name}" for name in (
        "counters_values_and_key_count", "compare_set_rules", "wait_times_out_then_works",
        "get_timeout_wording_and_the_store_still_works", "append_makes_and_extends",
        "multi_set_and_multi_get", "a_clone_sees_the_same_keys",
        "a_wait_in_one_thread_is_released_by_a_set_in_another")),
}

#: torch 2.13's words, as its stores raise them (pydvm's detail follows in
#: parentheses and is cut off by the job before comparing).
TCP_GET_TIMEOUT = ["raised", "DistStoreError", "wait timeout after 100ms, keys: /nonexistent key"]
TCP_EMPTY = ["raised", "QueueEmptyError", "queue is empty"]
NOT_ROUTED = ["raised", "NotImplementedError", "queue support is not implemented."]


def parity_cases(out: str) -> dict[str, dict]:
    return {ln.split(" ", 2)[1]: json.loads(ln.split(" ", 2)[2])
            for ln in out.splitlines() if ln.startswith("CASE ")}


def test_pydvm_store_behaves_as_tcpstore_case_by_case(tdvm):
    """Every behaviour torch's StoreTestBase, TimeoutTest, TestMultiThreadedWait
    and RendezvousTCPTest check -- counters, compare_set, waits and their
    timeout wording, append, multi_get/multi_set, clone, list_keys, a signal
    during a wait, and the queue calls (FIFO, len, check/wait on a queue,
    non-blocking pops, timeouts, two threads both ways) -- gives the same
    results on a PydvmStore in a job (on a daemon node) as on a TCPStore,
    directly and through torch's C++ PrefixStore; the queues' keys are the
    job's and go with it."""
    p = tdvm.run("--host", "b", "-n", "1", *PARITY_JOB, "one", timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    cases = parity_cases(p.stdout)
    differ = {name: got for name, got in cases.items()
              if name in PARITY and got["pydvm"] != got["tcp"]}
    assert not differ, json.dumps(differ, indent=1)
    assert set(cases) == PARITY | {"prefix:queues_and_list_keys"}, set(cases) ^ PARITY
    # the exact words torch's users and tests match on
    assert cases["get_timeout_wording_and_the_store_still_works"]["pydvm"][0] == TCP_GET_TIMEOUT
    assert cases["queue_pop_without_blocking"]["pydvm"][0] == TCP_EMPTY
    assert cases["queue_pop_times_out_in_tcpstore_words"]["pydvm"][0] == [
        "raised", "DistStoreError", "wait timeout after 10ms, keys: /non_existant"]
    # what torch 2.13 does not route to a store written in Python: a C++
    # PrefixStore's queue calls and list_keys reach TCPStore's C++ methods,
    # and the base class's "not implemented" for any Python store
    routed = cases["prefix:queues_and_list_keys"]
    assert routed["tcp"] == [None, 1, "b:1", []], routed
    assert routed["pydvm"] == [NOT_ROUTED] * 3 + [
        ["raised", "NotImplementedError", "listKeys support is not implemented."]], routed
    queue_keys = [int(ln.split()[1]) for ln in p.stdout.splitlines()
                  if ln.startswith("QUEUEKEYS")]
    assert queue_keys and queue_keys[0] > 0, p.stdout
    assert_no_torch_keys(tdvm)


def test_a_queue_shared_by_ranks_on_two_nodes_gives_each_item_once_as_tcpstore_does(tdvm):
    """Rank 0 pushes 40 items and an end mark per rank; 4 ranks on 2 nodes pop
    until their mark: with PydvmStore as with TCPStore, every item is taken
    exactly once, each rank takes its items in push order, the queue is empty
    after; the ranks then meet through a counter and a queue of release
    marks.  Nothing is left once the job ends."""
    p = tdvm.run("--host", "a:2,b:2", "-n", "4", *PARITY_JOB, "ranks", timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    items = [f"item{i}" for i in range(40)]
    for kind in ("pydvm", "tcp"):
        took = {int(ln.split()[2]): ln.split()[3:] for ln in p.stdout.splitlines()
                if ln.startswith(f"TOOK {kind} ")}
        assert sorted(took) == [0, 1, 2, 3], p.stdout
        taken = [item for rank_items in took.values() for item in rank_items if item != "-"]
        assert sorted(taken, key=lambda s: int(s[4:])) == items, (kind, took)
        for rank_items in took.values():
            order = [int(s[4:]) for s in rank_items if s != "-"]
            assert order == sorted(order), (kind, took)
        left = sorted(ln for ln in p.stdout.splitlines() if ln.startswith(f"LEFT {kind} "))
        assert left == [f"LEFT {kind} {r} 0" for r in range(4)], p.stdout
    assert_no_torch_keys(tdvm)


def test_a_jobs_queues_go_with_it_when_a_rank_dies_while_another_waits_in_a_pop(tdvm):
    """Items left on one queue, a pop waiting on another, then a rank killed:
    the job ends, and none of its queues' keys stays in the DVM."""
    p = tdvm.run("--abort-on-failure", "--host", "a:1,b:1", "-n", "2", *PARITY_JOB, "crash",
                 timeout=120)
    assert p.returncode != 0 and "signal SIGKILL" in p.stderr, p.stdout + p.stderr
    assert "KILLING 5" in p.stdout, p.stdout + p.stderr
    assert_no_torch_keys(tdvm)
