"""Job events on a shared DVM (issue 32): a user sees their own jobs' events only.

Users A and B each stream ``pydvm events`` while both run jobs; root (the
DVM's owner) streams too.  A's stream never names B's job, root's names
both, and A may not subscribe to B's job by name.
"""

from __future__ import annotations

import json
import subprocess

from dvmkit import LineReader, finish, wait_for

A, B = "pdvmtesta", "pdvmtestb"
NSPACE_JOB = ("sh", "-c", 'echo "$PYDVM_NSPACE"')


def _ended(reader: LineReader, ns: str) -> bool:
    return any(json.loads(ln)["nspace"] == ns and json.loads(ln)["kind"] == "ended"
               for ln in list(reader.lines))


def _named(reader: LineReader) -> set[str]:
    return {json.loads(ln)["nspace"] for ln in list(reader.lines)}


def _run(mudvm, user: str) -> str:
    p = mudvm.as_user(user, "run", "-n", "1", *NSPACE_JOB)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_a_user_sees_only_their_own_jobs_events_and_root_sees_all(mudvm, users):
    ev_a = mudvm.popen_as(A, "events", "--json")
    ev_root = subprocess.Popen([mudvm.python, "-m", "pydvm", "events", "--json"],
                               env={**mudvm.root_env, "PYDVM_URI": mudvm.uri},
                               stdout=subprocess.PIPE, text=True, cwd="/tmp")
    a, root = LineReader(ev_a.stdout), LineReader(ev_root.stdout)
    try:
        # Both streams are live once they have shown the end of a job of A's
        # (a subscription only hears what happens after it: under load a
        # stream may subscribe after the first job's end, so run jobs until
        # one is seen ending on both).
        firsts: list[str] = []

        def live() -> bool:
            if any(_ended(a, f) and _ended(root, f) for f in firsts):
                return True
            firsts.append(_run(mudvm, A))
            return False
        wait_for(live, timeout=120, interval=0.5, what="both streams subscribed")
        first = next(f for f in firsts if _ended(a, f) and _ended(root, f))
        theirs = _run(mudvm, B)
        mine = _run(mudvm, A)
        wait_for(lambda: _ended(a, mine) and _ended(root, mine) and _ended(root, theirs),
                 timeout=60, what="the jobs' ends")
        assert theirs not in _named(a), a.lines
        assert first in _named(a) and _named(a) <= {*firsts, mine} and mine in _named(a)
        assert {first, mine, theirs} <= _named(root)
        # By name: B's running job is not A's to watch.
        held = mudvm.popen_as(B, "run", "-n", "1", "sh", "-c", 'echo "$PYDVM_NSPACE"; sleep 60')
        try:
            ns = held.stdout.readline().strip()
            p = mudvm.as_user(A, "events", "--job", ns)
            assert p.returncode == 1 and "is not your job" in p.stderr, p.stderr
            assert "PMIX_ERR_NO_PERMISSIONS" in p.stderr
        finally:
            assert mudvm.as_user(None, "kill", ns).returncode == 0
            finish(held, 30)
    finally:
        for p in (ev_a, ev_root):
            p.terminate()
            finish(p, 30)
