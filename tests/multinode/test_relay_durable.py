"""Relayed purges are never lost (issue 13).

A relaying DVM on test host c sends its lifetimes to a data server that
stays up on the host side.  The network link between them is cut (a veth
set down: no FIN, no RST) while a relayed job ends, then restored: the
job's purge, queued meanwhile, is re-sent on the reconnection, so the job's
items leave the data server -- and only that job's.
"""

from __future__ import annotations


from dvmkit import LineReader, finish, status, wait_for
from test_loss_and_partition import relay_on_c


def test_a_job_ending_during_a_partition_is_purged_from_the_data_server_after_it(
        tmp_path, hostnet):
    with relay_on_c(tmp_path, hostnet) as relay:
        keep = relay.run("-n", "1", "pydvm", "publish", "keep=1", "--persistence", "session")
        assert status(keep) == "PMIX_SUCCESS", keep.stdout + keep.stderr
        # the job ends when told (a file appears), not after a time that a
        # loaded machine can outrun before the store is read
        flag = tmp_path / "end-now"
        job = relay.popen("-n", "1", "sh", "-c",
                          "pydvm publish gone=1 && pydvm publish alsogone=1 --persistence app "
                          f"&& while [ ! -e {flag} ]; do sleep 0.05; done")
        reader = LineReader(job.stdout)
        reader.wait_line("PUBLISHED alsogone", timeout=30)
        keys = relay.server.store()["master"]["keys"]
        assert {"keep", "gone", "alsogone"} <= set(keys), keys
        hostnet.link("c", up=False)
        flag.touch()
        finish(job)  # the job ends during the partition
        assert job.returncode == 0
        assert {"gone", "alsogone"} <= set(relay.server.store()["master"]["keys"])
        hostnet.link("c", up=True)
        wait_for(lambda: set(relay.server.store()["master"]["keys"]) == {"keep"}, timeout=30,
                 what="the queued purges to reach the data server after the reconnection")
