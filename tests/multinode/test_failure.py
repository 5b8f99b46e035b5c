"""What the DVM does when a node, the master, a client or a link fails.

Every daemon is on its own test host, so a lost host is a real network
failure.  Heartbeats run at 0.5 s here, so a silent peer is declared lost
after about 1.5 s.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from hostnet import start_net_dvm
from dvmkit import pid_alive, wait_for

JOBS = Path(__file__).parent / "jobs"
HB = {"pydvm_heartbeat_interval": "0.5"}


def _net_dvm(tmp_path, hostnet, **mca):
    return start_net_dvm(tmp_path, hostnet, mca={**HB, **mca})


def test_sigkilled_daemon_fails_its_jobs_naming_the_node_and_others_keep_running(
        tmp_path, hostnet):
    """SIGKILL node b's daemon mid-job: the job on a+b fails naming b; a job on a+c still runs."""
    dvm = _net_dvm(tmp_path, hostnet)
    try:
        job = dvm.run_bg("--host", "a,b", "-n", "2", "sh", "-c",
                         "pydvm publish up$PYDVM_RANK=1 --persistence proc --hold 60")
        wait_for(lambda: len(dvm.store()["master"].get("keys", [])) == 2, timeout=30,
                 what="both ranks to publish")
        os.kill(dvm.daemon_pids["b"], signal.SIGKILL)
        out, err = job.communicate(timeout=30)
        assert job.returncode == 255, (out, err)
        assert "node b" in err, err
        # Both ranks' PROC items went: b's with its node, a's when the job was killed.
        assert dvm.store()["master"]["items"] == 0
        assert "b" not in dvm.store()
        p = dvm.run("--host", "a,c", "-n", "2", "sh", "-c", "echo alive $PYDVM_NODE")
        assert p.returncode == 0, p.stderr
        assert sorted(p.stdout.split("\n")[:-1]) == ["alive a", "alive c"]
        # A job naming the lost node is refused with a clear message.
        q = dvm.run("--host", "b", "-n", "1", "true")
        assert q.returncode != 0 and "not available: b" in q.stderr
    finally:
        dvm.stop()


def test_host_lost_without_a_goodbye_is_noticed_by_heartbeat(tmp_path, hostnet):
    """Cut b's link, then kill everything on b: no FIN reaches the master, the heartbeat does."""
    dvm = _net_dvm(tmp_path, hostnet)
    try:
        job = dvm.run_bg("--host", "b", "-n", "1", "sh", "-c",
                         "pydvm publish onb=1 --hold 60")
        wait_for(lambda: "onb" in dvm.store()["master"].get("keys", []), timeout=30,
                 what="the job on b to publish")
        hostnet.link("b", up=False)
        hostnet.kill_host("b")
        t0 = time.monotonic()
        out, err = job.communicate(timeout=30)
        noticed = time.monotonic() - t0
        assert job.returncode == 255, (out, err)
        assert "node b" in err
        assert noticed < 10, f"took {noticed:.1f}s to notice a dead host (heartbeat 0.5s)"
        assert "no heartbeat" in dvm.log("master")
        assert dvm.store()["master"]["items"] == 0  # the job's NSPACE item went with the job
    finally:
        dvm.stop()


def test_master_death_makes_daemons_kill_their_processes_and_exit(tmp_path, hostnet):
    """kill -9 the master: a parked client call gets UNREACH, job processes and daemons exit."""
    dvm = _net_dvm(tmp_path, hostnet)
    report = tmp_path / "report"
    job = dvm.run_bg("--host", "c", "-n", "1", sys.executable, str(JOBS / "wait_then_report.py"),
                     str(report))
    try:
        wait_for(lambda: Path(str(report) + ".ready").exists(), timeout=30,
                 what="the client to park its lookup")
        wait_for(lambda: dvm.store()["master"]["parked"] == 1, timeout=10,
                 what="the lookup to be parked in the master store")
        job_pids = hostnet.pids("c")
        os.kill(dvm.pid, signal.SIGKILL)
        wait_for(report.exists, timeout=20, what="the client's report")
        assert report.read_text().strip() == "PMIX_ERR_UNREACH"
        wait_for(lambda: not any(pid_alive(p) for p in dvm.daemon_pids.values()), timeout=20,
                 what="every daemon to exit")
        wait_for(lambda: not any(pid_alive(p) for p in job_pids), timeout=20,
                 what="every job process to exit")
        job.communicate(timeout=20)
        assert job.returncode != 0  # its DVM is gone
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
        dvm.stop()


def test_client_dying_with_a_parked_lookup_is_dropped_and_never_answered(tmp_path, hostnet):
    """A client killed while its lookup waits: the lookup is dropped; a later publish answers nobody."""
    dvm = _net_dvm(tmp_path, hostnet, prte_data_server_verbose="2")
    try:
        job = dvm.run_bg("--host", "a", "-n", "1", "pydvm", "lookup", "late", "--wait")
        wait_for(lambda: dvm.store()["master"]["parked"] == 1, timeout=30,
                 what="the lookup to park")
        pid = int(wait_for(lambda: [x for x in hostnet.pids("a") if _is_lookup(x)], timeout=10,
                           what="the lookup process")[0])
        os.kill(pid, signal.SIGKILL)
        job.communicate(timeout=30)
        assert job.returncode == 137
        wait_for(lambda: dvm.store()["master"]["parked"] == 0, timeout=10,
                 what="the parked lookup to be dropped")
        p = dvm.run("--host", "b", "-n", "1", "pydvm", "publish", "late=1", "--persistence",
                    "session")
        assert p.returncode == 0, p.stderr
        # Nothing tried to answer the dead client: no error anywhere.
        for name in ("master", "a", "b"):
            assert "ERROR" not in dvm.log(name), dvm.log(name)
    finally:
        dvm.stop()


def _is_lookup(pid: int) -> bool:
    try:
        return b"lookup" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_brief_link_drop_loses_nothing_and_the_node_stays(tmp_path, hostnet):
    """b's link goes down for 1 s (under 3 heartbeats of 2 s): node, items and a wait survive.

    TCP retransmits across the outage, so neither side notices; the node is
    never declared lost and nothing is removed while the master still
    considers it alive.  (An outage longer than 3 heartbeat periods makes
    the master declare the node lost -- see the heartbeat test above.)
    """
    dvm = start_net_dvm(tmp_path, hostnet, mca={"pydvm_heartbeat_interval": "2"})
    try:
        job = dvm.run_bg("--host", "b", "-n", "1", "sh", "-c",
                         "pydvm publish g=1 --persistence session && "
                         "pydvm publish l=1 --range local && "
                         "pydvm lookup after --wait --timeout 30 && "
                         "pydvm lookup l --range local")
        wait_for(lambda: dvm.store().get("b", {}).get("items") == 1
                 and dvm.store()["master"]["parked"] == 1, timeout=30,
                 what="b's items and its waiting lookup")
        hostnet.link("b", up=False)
        time.sleep(1.0)  # the outage being simulated
        hostnet.link("b", up=True)
        p = dvm.run("--host", "a", "-n", "1", "pydvm", "publish", "after=1")
        assert p.returncode == 0, p.stderr
        out, err = job.communicate(timeout=40)
        assert job.returncode == 0, (out, err)
        assert "FOUND after 1" in out and "FOUND l 1" in out
        st = dvm.store()
        assert "g" in st["master"]["keys"]
        assert "lost node" not in dvm.log("master")
    finally:
        dvm.stop()

