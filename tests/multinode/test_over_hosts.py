"""The multi-daemon end-to-end cases, re-run with each daemon on its own test host.

These are the tests of ``tests/e2e`` that involve more than one daemon,
imported unchanged; the ``dvm`` / ``make_dvm`` fixtures of this directory put
daemons ``a``, ``b``, ``c`` in separate network namespaces, started by the
``ssh`` launcher through ``ip netns exec``, with the master on the bridge.
"""

from test_lookup_rules import (  # noqa: F401
    test_local_range_item_is_held_by_its_daemon_and_seen_only_from_its_node,
)
from test_retention import (  # noqa: F401
    test_app_item_goes_with_its_application_while_nspace_item_stays_until_job_end,
    test_indef_and_unread_first_read_items_expire_after_the_idle_timeout_not_before,
    test_nspace_item_survives_an_early_finishing_daemons_share_of_the_job,
    test_one_uids_flood_at_the_cap_evicts_its_own_oldest_items,
    test_session_item_survives_its_job_and_goes_when_the_session_ends,
)
from test_smoke import (  # noqa: F401
    test_job_ranks_spread_over_hosts_by_default_mapping,
    test_publish_on_one_node_is_found_from_another,
)
from test_waiting import (  # noqa: F401
    test_waiting_lookup_ends_with_timeout_after_its_timeout,
    test_waiting_lookup_on_one_daemon_is_answered_by_a_publish_on_another,
)


def test_each_daemon_runs_in_its_own_network_namespace(dvm, hostnet):
    """Job processes on node b see b's own address, not the master's or a's."""
    p = dvm.run("--host", "b", "-n", "1", "ip", "-o", "-4", "addr", "show", "eth0")
    assert p.returncode == 0, p.stderr
    assert f"{hostnet.addr(2)}/24" in p.stdout
    assert f"inet {hostnet.master_addr}/" not in p.stdout
