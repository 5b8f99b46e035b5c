"""Job programs for the direct data path tests (tests/e2e/test_direct_data.py).

argv[1] is the mode:

* ``basic``: publish a SESSION and a LOCAL item, look both up, unpublish
  one SESSION key, and print ``DIRECT <bool>`` (the client's direct
  connection is open), ``FOUND <key> <value>``, ``GONE <key>``.
* ``forge FIELD VALUE``: replace one field of this process's own credential
  in its environment (``app``, ``session``, ``nonce``, ``key``; ``key
  flip`` changes its last digit) and publish ``forged``; prints
  ``PUBLISH <status name>``.
* ``creds GO``: print ``CRED <rank> <nspace> <token>`` and, for rank 0,
  exit at once; other ranks wait for the file GO.
* ``park``: an asyncio waiting lookup of ``parked-key``; prints
  ``PARKED direct=<bool>`` once sent, then ``ANSWER <value>``.
* ``aio_unpub``: the asyncio client publishes ``am`` (SESSION) and ``al``
  (LOCAL), unpublishes both, prints ``GONE <key> <status>`` for each, then
  unpublishes again (nothing of its uid left on the node) and prints
  ``AIO direct=<bool>``.
* ``cancel GO``: an asyncio waiting lookup over the direct connection,
  cancelled; prints ``CANCELLED direct=<bool> pending=<n>`` and holds the
  connection until the file GO exists.
* ``proc``: rank 0 publishes ``p0`` (PROC) directly and exits; rank 1
  waits until it is gone and prints ``P0 GONE`` (or ``P0 STILL``).
* ``linger GO REPORT``: a child connects and publishes once (opening its
  direct connection), the parent exits; after GO the child publishes on
  the held client and on a new one, writing ``HELD <status> <text>`` and
  ``NEW <status>`` to REPORT.
* ``unpub_local_rounds N``: N rounds of ``unpub_local``, each key the node
  store's only item of the uid; rank 1 prints ``GONE <n> OF N DIRECT <bool>``.
* ``unpub_local``: rank 0 publishes ``lk`` LOCAL; rank 1 (same node, same
  uid) then unpublishes ``lk`` over its direct connection and prints
  ``LK <status of a LOCAL lookup>``.
"""

import asyncio
import os
import sys
import time

from _common import RANK, Client, Persistence, Range, out, wait_file, wait_gone
from pydvm.errors import PMIxError

mode = sys.argv[1]

if mode == "basic":
    with Client() as c:
        c.publish({"d-session": "s1", "d-other": "s2"}, persistence=Persistence.SESSION)
        c.publish({"d-local": "l1"}, range=Range.LOCAL, persistence=Persistence.SESSION)
        out("DIRECT", c.direct)
        out("FOUND d-session", c.lookup("d-session")["d-session"])
        out("FOUND d-local", c.lookup("d-local", range=Range.LOCAL)["d-local"])
        c.unpublish(["d-other"])
        try:
            c.lookup("d-other")
            out("STILL d-other")
        except PMIxError:
            out("GONE d-other")

elif mode == "forge":
    field, value = sys.argv[2], sys.argv[3]
    parts = os.environ["PYDVM_DIRECT_CRED"].split(":", 7)
    i = {"app": 3, "session": 4, "nonce": 5, "key": 6}[field]
    if value == "flip":
        value = parts[i][:-1] + ("0" if parts[i][-1] != "0" else "1")
    parts[i] = value
    os.environ["PYDVM_DIRECT_CRED"] = ":".join(parts)
    try:
        c = Client()
        c.publish({"forged": "1"}, persistence=Persistence.SESSION)
        out("PUBLISH PMIX_SUCCESS")
    except PMIxError as exc:
        out("PUBLISH", exc.status.pmix_name)

elif mode == "creds":
    out("CRED", RANK, os.environ["PYDVM_NSPACE"], os.environ.get("PYDVM_DIRECT_CRED", "-"))
    if RANK != 0:
        wait_file(sys.argv[2], 60)

elif mode == "park":
    import pydvm.aio

    async def main() -> None:
        async with await pydvm.aio.Client.connect() as c:
            await c.publish({"warmup": "1"}, persistence=Persistence.PROC)
            task = asyncio.ensure_future(c.lookup(["parked-key"], wait=True, timeout=60))
            await asyncio.sleep(0.2)
            out(f"PARKED direct={c.direct}")
            r = await task
            out("ANSWER", r["parked-key"])

    asyncio.run(main())

elif mode == "aio_unpub":
    import pydvm.aio

    async def main() -> None:
        async with await pydvm.aio.Client.connect() as c:
            await c.publish({"am": "1"}, persistence=Persistence.SESSION)
            await c.publish({"al": "1"}, range=Range.LOCAL, persistence=Persistence.SESSION)
            await c.unpublish(["am", "al"])  # the node store holds "al": both parts
            for key, rng in (("am", Range.SESSION), ("al", Range.LOCAL)):
                try:
                    await c.lookup([key], range=rng)
                    out("STILL", key)
                except PMIxError as exc:
                    out("GONE", key, exc.status.pmix_name)
            await c.unpublish(["am"])  # the node store holds nothing now: master only
            out(f"AIO direct={c.direct}")

    asyncio.run(main())

elif mode == "cancel":
    import pydvm.aio

    async def main() -> None:
        async with await pydvm.aio.Client.connect() as c:
            task = asyncio.ensure_future(c.lookup(["never"], wait=True))
            await asyncio.sleep(0.5)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            out(f"CANCELLED direct={c.direct} pending={len(c._dch._pending)}")
            wait_file(sys.argv[2], 40)

    asyncio.run(main())

elif mode == "proc":
    with Client() as c:
        if RANK == 0:
            c.publish({"p0": "x"}, persistence=Persistence.PROC)
            out("P0 DIRECT", c.direct)
        else:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    c.lookup("p0")
                    break
                except PMIxError:
                    time.sleep(0.05)
            out("P0", "GONE" if wait_gone(c, "p0") else "STILL")

elif mode == "linger":
    go, report = sys.argv[2], sys.argv[3]
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(r)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        rep = open(report, "w", buffering=1)
        c = Client()
        c.publish({"early": "1"}, persistence=Persistence.SESSION)
        rep.write(f"OPEN {c.direct}\n")
        os.write(w, b"x")
        os.close(w)
        wait_file(go, 40)
        try:
            c.publish({"late-held": "1"}, persistence=Persistence.SESSION)
            rep.write("HELD PMIX_SUCCESS -\n")
        except PMIxError as exc:
            rep.write(f"HELD {exc.status.pmix_name} {exc}\n")
        try:
            Client().publish({"late-new": "1"}, persistence=Persistence.SESSION)
            rep.write("NEW PMIX_SUCCESS\n")
        except PMIxError as exc:
            rep.write(f"NEW {exc.status.pmix_name}\n")
        rep.close()
        os._exit(0)
    os.close(w)
    os.read(r, 1)
    out("PARENT EXITING", os.getpid())

elif mode == "unpub_local":
    with Client() as c:
        if RANK == 1:
            c.publish({"r1-ready": "1"}, persistence=Persistence.PROC)
            c.lookup(["lk-done"], wait=True, timeout=30)
            c.unpublish(["lk"])
            out("UNPUB DIRECT", c.direct)
            try:
                c.lookup("lk", range=Range.LOCAL)
                out("LK STILL")
            except PMIxError as exc:
                out("LK", exc.status.pmix_name)
        else:
            c.lookup(["r1-ready"], wait=True, timeout=30)
            c.publish({"lk": "x"}, range=Range.LOCAL, persistence=Persistence.SESSION)
            c.publish({"lk-done": "1"}, persistence=Persistence.PROC)
            time.sleep(1)  # lk-done (PROC) must outlive rank 1's lookup

elif mode == "unpub_local_rounds":
    # Round i: rank 0 publishes lk-i LOCAL -- each time the node store's first
    # item of this uid, since rank 1 removed the last one -- then tells rank 1
    # through the master store; rank 1 unpublishes it at once over its direct
    # connection and checks it is gone from the node store.
    rounds = int(sys.argv[2])
    with Client() as c:
        gone = 0
        for i in range(rounds):
            if RANK == 0:
                c.publish({f"lk-{i}": "x"}, range=Range.LOCAL, persistence=Persistence.SESSION)
                c.publish({f"lk-done-{i}": "1"}, persistence=Persistence.SESSION)
                c.lookup([f"lk-seen-{i}"], wait=True, timeout=30)
            else:
                c.lookup([f"lk-done-{i}"], wait=True, timeout=30)
                c.unpublish([f"lk-{i}"])
                try:
                    c.lookup(f"lk-{i}", range=Range.LOCAL)
                except PMIxError:
                    gone += 1
                c.publish({f"lk-seen-{i}": "1"}, persistence=Persistence.SESSION)
        if RANK == 1:
            out("GONE", gone, "OF", rounds, "DIRECT", c.direct)

else:
    sys.exit(f"unknown mode {mode}")
