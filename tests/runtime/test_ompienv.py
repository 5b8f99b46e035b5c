"""runtime/node/ompienv.py: the Open MPI variables of each rank, from a job layout
(pure; the same against mpirun end to end: tests/e2e/test_rank_env.py)."""

from __future__ import annotations

from pydvm.runtime.node import ompienv

LAYOUT = {"nodes": {"a": [0, 1, 4], "b": [2, 3]}, "apps": [3, 2], "univ_size": 8,
          "slots": {"a": 2, "b": 2}, "argv": [["./prog", "x", "y z"], ["/bin/other"]],
          "wdir": ["/work", None]}


def test_every_rank_gets_world_local_and_app_values():
    envs = ompienv.launch_envs(LAYOUT, "a", [{"rank": 0, "app_idx": 0},
                                             {"rank": 4, "app_idx": 1}],
                               {0: "/d/0", 4: "/d/4"})
    r0, r4 = envs
    assert r0["OMPI_COMM_WORLD_RANK"] == "0" and r4["OMPI_COMM_WORLD_RANK"] == "4"
    assert r4["OMPI_COMM_WORLD_LOCAL_RANK"] == r4["OMPI_COMM_WORLD_NODE_RANK"] == "2"
    assert r4["OMPI_MCA_orte_ess_node_rank"] == "2"
    assert r0["OMPI_COMM_WORLD_SIZE"] == r0["OMPI_MCA_orte_ess_num_procs"] == "5"
    assert r0["OMPI_COMM_WORLD_LOCAL_SIZE"] == "3"
    assert r0["OMPI_UNIVERSE_SIZE"] == "8"
    assert r0["OMPI_MCA_orte_num_nodes"] == "2"
    assert r0["OMPI_NUM_APP_CTX"] == "2" and r0["OMPI_APP_CTX_NUM_PROCS"] == "3 2"
    assert r0["OMPI_FIRST_RANKS"] == "0 3"
    assert (r0["OMPI_MCA_orte_app_num"], r4["OMPI_MCA_orte_app_num"]) == ("0", "1")
    assert (r0["OMPI_COMMAND"], r0["OMPI_ARGV"]) == ("prog", "x y z")
    assert r4["OMPI_COMMAND"] == "other" and "OMPI_ARGV" not in r4
    assert r0["OMPI_MCA_initial_wdir"] == r0["PWD"] == "/work"
    assert "OMPI_MCA_initial_wdir" not in r4
    assert (r0["OMPI_FILE_LOCATION"], r4["OMPI_FILE_LOCATION"]) == ("/d/0", "/d/4")


def test_oversubscribed_where_a_node_runs_more_ranks_than_its_slots():
    assert ompienv.job_env(LAYOUT, "a")["OMPI_MCA_mpi_oversubscribe"] == "1"
    assert ompienv.job_env(LAYOUT, "b")["OMPI_MCA_mpi_oversubscribe"] == "0"
    unknown = {**LAYOUT, "slots": {"a": 0}}
    assert ompienv.job_env(unknown, "a")["OMPI_MCA_mpi_oversubscribe"] == "0"


def test_the_universe_is_at_least_the_job():
    assert ompienv.universe_size({**LAYOUT, "univ_size": 2}) == 5
    assert ompienv.universe_size({"nodes": {"a": [0]}}) == 1


def test_stale_launch_state_goes_and_a_users_tunables_stay():
    env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_MCA_orte_hnp_uri": "x", "OMPI_MCA_ess": "^s",
           "OMPI_MCA_ess_base_vpid": "1", "OMPI_UNIVERSE_SIZE": "9", "OMPI_ARGV": "a",
           "OMPI_MCA_btl": "self,tcp", "OMPI_MCA_orte_base_help_aggregate": "0",
           "OMPI_MCA_essential_user_knob": "1", "PATH": "/bin"}
    copy = ompienv.without_stale(env)
    again = ompienv.without_stale(env, ("SLURM_", "PA"))
    ompienv.drop_stale(env)
    assert env == {"OMPI_MCA_btl": "self,tcp", "OMPI_MCA_orte_base_help_aggregate": "0",
                   "OMPI_MCA_essential_user_knob": "1", "PATH": "/bin"}
    assert copy == env  # the one-pass copy drops the same
    assert again == {k: v for k, v in env.items() if k != "PATH"}


def test_a_pydvm_job_directory_is_replaced_a_users_kept():
    names = ("OMPI_MCA_btl_vader_backing_directory", "OMPI_MCA_orte_tmpdir_base",
             "OMPI_MCA_osc_sm_backing_directory")
    env = {names[0]: "/dev/shm/pydvm-0/abcd1234-a-jobs-x1y2/7",    # a parent's, node a
           names[1]: "/scratch/mine"}                              # the user's own
    ompienv.own_job_dirs(env, names, "/dev/shm/pydvm-0/abcd1234-b-jobs-q9/8")
    assert env == {names[0]: "/dev/shm/pydvm-0/abcd1234-b-jobs-q9/8",
                   names[1]: "/scratch/mine",
                   names[2]: "/dev/shm/pydvm-0/abcd1234-b-jobs-q9/8"}
    assert ompienv.is_pydvm_job_dir("/tmp/pydvm-1000-mu/abcd-b-7xq/jobs/3")
    assert ompienv.is_pydvm_job_dir("/dev/shm/pydvm-0-mu/ab-n-jobs-z")
    assert not ompienv.is_pydvm_job_dir("/home/u/pydvm-0/jobs")
    assert not ompienv.is_pydvm_job_dir("/tmp/pydvm-notes/x-jobs-y")
