"""The basic path: a job runs on several daemons and rendezvous through the master store."""

from dvmkit import lines


def test_job_ranks_spread_over_hosts_by_default_mapping(dvm):
    """Without --host an app uses every host of its session in order, one slot each."""
    p = dvm.run("-n", "4", "sh", "-c", 'echo "$PYDVM_RANK $PYDVM_NODE $PYDVM_JOB_SIZE"')
    assert p.returncode == 0, p.stderr
    got = sorted(p.stdout.split("\n")[:-1])
    assert got == ["0 a 4", "1 b 4", "2 c 4", "3 a 4"]


def test_publish_on_one_node_is_found_from_another(dvm):
    """A SESSION-range item published on node a is found by a process on node c."""
    p = dvm.run("--host", "a", "-n", "1", "pydvm", "publish", "addr=tcp://x:1",
                "--persistence", "session")
    assert p.returncode == 0, p.stderr
    assert lines(p, "PUBLISHED") == ["PUBLISHED addr"]
    q = dvm.run("--host", "c", "-n", "1", "pydvm", "lookup", "addr")
    assert q.returncode == 0, q.stderr
    assert lines(q, "FOUND")[0].startswith("FOUND addr tcp://x:1 from ")
    assert q.stdout.strip().endswith("STATUS PMIX_SUCCESS")
