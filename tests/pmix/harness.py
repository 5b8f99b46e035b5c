"""Test host for the PMIx binding: a PmixServer answering from an in-memory store.

Run as a program: ``python harness.py SPEC.json``.  It starts the server on an
asyncio loop, registers one namespace and its clients, forks each client
with the environment ``setup_fork`` gives (plus the spec's extra variables),
waits for them, deregisters each as it is reaped, and prints one JSON report
line on stdout (``REPORT {...}``): the clients' exit codes and output, every
request the host received (as plain data), and the server's counters.

The store implements just enough of pydvm's rules to exercise the binding:
duplicate keys refused, lookups answering SUCCESS / PARTIAL_SUCCESS /
NOT_FOUND, ``wait`` parking with ``timeout``, FIRST_READ consumption,
unpublish by owner, fence echoing its own contribution, direct modex through
``dmodex_request``.

With ``answer_now`` in the spec, the host also gives the server an
``answer_now``: a publish, an unpublish and a lookup that need not wait are
answered on libpmix's progress thread, inside the upcall, when no lookup is
parked (the host's state is behind one lock, taken there without waiting);
the rest goes to the loop.  The report's ``now`` lists the kinds answered so.

Spec keys: tmpdir, nspace, node, nodes {name: [ranks]}, apps [sizes],
clients [{rank, argv, env, delay, uid, gid}], env {..}, fail {kind, mode}, timeout,
max_value_size, regex (bool), lookup_timeout_default, answer_now (bool).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
import time

from pydvm.pmix import Handler, PmixServerError, PmixServer, Proc, Value, constants as C
from pydvm.pmix.jobinfo import JobLayout, job_info


def jv(v: Value):
    """A Value as JSON: [python value (bytes as hex), type code]."""
    x = v.value
    if isinstance(x, bytes):
        x = x.hex()
    elif isinstance(x, Proc):
        x = str(x)
    elif x is not None and not isinstance(x, (str, int, float, bool)):
        x = repr(x)
    return [x, v.type]


def describe(req) -> dict:
    d = {"kind": req.kind}
    for name in ("proc", "keys", "range", "persistence", "wait", "timeout", "collect",
                 "status", "message", "access_uids", "access_gids"):
        if hasattr(req, name):
            v = getattr(req, name)
            d[name] = str(v) if isinstance(v, Proc) else (list(v) if isinstance(v, tuple) else v)
    if hasattr(req, "procs"):
        d["procs"] = [str(p) for p in req.procs]
    if hasattr(req, "pairs"):
        d["pairs"] = {k: jv(v) for k, v in req.pairs.items()}
    if hasattr(req, "directives"):
        d["directives"] = {k: jv(v) for k, v in req.directives.items()}
    if hasattr(req, "data"):
        d["ndata"] = len(req.data)
    if hasattr(req, "queries"):
        d["server"] = str(req.server)
        d["queries"] = [{"keys": q.keys, "qualifiers": {k: jv(v) for k, v in q.qualifiers.items()}}
                        for q in req.queries]
    if hasattr(req, "apps"):
        d["apps"] = [{"cmd": a.cmd, "argv": a.argv, "env": a.env, "cwd": a.cwd,
                      "maxprocs": a.maxprocs} for a in req.apps]
    return d


class DictHost(Handler):
    def __init__(self, server: PmixServer, spec: dict):
        self.server = server
        self.store: dict[str, tuple[Value, Proc, int | None]] = {}
        self.parked: list = []
        self.log: list[dict] = []
        self.fail = spec.get("fail") or {}
        self.seen = 0
        self.local_ranks: set[int] = set()
        #: the host's state, shared with libpmix's thread (answer_now)
        self.lock = threading.Lock()
        self.now: list[str] = []

    def answer_now(self, req) -> bool:
        """libpmix's thread: answer if nothing waits and the lock is free."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            if self.parked or (req.kind == "lookup" and req.wait is not None) \
                    or self.fail.get("kind") == req.kind:
                return False
            self.log.append(describe(req))
            self.seen += 1
            self.now.append(req.kind)
            getattr(self, req.kind)(req)
            return True
        finally:
            self.lock.release()

    def __call__(self, req):
        with self.lock:
            return self._serve(req)

    def _serve(self, req):
        self.log.append(describe(req))
        self.seen += 1
        if self.fail.get("kind") == req.kind:
            mode = self.fail.get("mode", "sync")
            if mode == "sync":
                raise RuntimeError("injected handler failure")
            if mode == "status":
                raise PmixServerError(self.fail.get("status", C.ERR_NO_PERMISSIONS), "injected")
            if mode == "async":
                async def boom():
                    await asyncio.sleep(0.01)
                    raise RuntimeError("injected async handler failure")
                return boom()
            if mode == "drop":
                return None          # the reply object is dropped unanswered
        return super().__call__(req)

    # -- data store ------------------------------------------------------

    def publish(self, req):
        if not req.pairs:
            req.reply(C.ERR_BAD_PARAM)
            return
        for k in req.pairs:
            if k in self.store:
                req.reply(C.ERR_DUPLICATE_KEY)
                return
        for k, v in req.pairs.items():
            self.store[k] = (v, req.proc, req.persistence)
        req.reply(C.SUCCESS)
        self._wake()

    def _find(self, keys):
        return [(k, self.store[k][0], self.store[k][1]) for k in keys if k in self.store]

    def _answer(self, req, found):
        for k, _, _ in found:
            if self.store.get(k, (None, None, None))[2] == C.PERSIST_FIRST_READ:
                del self.store[k]
        if len(found) == len(req.keys):
            status = C.SUCCESS
        elif found:
            status = C.ERR_PARTIAL_SUCCESS
        else:
            status = C.ERR_NOT_FOUND
        req.reply(status, found)

    def lookup(self, req):
        found = self._find(req.keys)
        if req.wait is None or len(found) >= req.wait_count:
            self._answer(req, found)
            return
        entry = [req, None]
        if req.timeout:
            loop = asyncio.get_running_loop()
            entry[1] = loop.call_later(req.timeout, self._expire, entry)
        self.parked.append(entry)

    def _expire(self, entry):
        with self.lock:
            if entry in self.parked:
                self.parked.remove(entry)
                entry[0].reply(C.ERR_TIMEOUT)

    def _wake(self):
        for entry in list(self.parked):
            req, timer = entry
            found = self._find(req.keys)
            if len(found) >= req.wait_count:
                self.parked.remove(entry)
                if timer:
                    timer.cancel()
                self._answer(req, found)

    def unpublish(self, req):
        for k in list(self.store):
            if (req.keys is None or k in req.keys) and self.store[k][1] == req.proc:
                del self.store[k]
        req.reply(C.SUCCESS)

    # -- collectives -----------------------------------------------------

    def fence(self, req):
        req.reply(C.SUCCESS, req.data if req.collect else b"")

    async def direct_modex(self, req):
        # a real host forwards this to the node of req.proc, whose server
        # answers with dmodex_request(); here only local procs can be served
        if req.proc.rank not in self.local_ranks:
            req.reply(C.ERR_NOT_FOUND)
            return
        status, blob = await self.server.dmodex_request(req.proc)
        req.reply(status, blob)

    def connect(self, req):
        req.reply(C.SUCCESS)

    def disconnect(self, req):
        req.reply(C.SUCCESS)

    def spawn(self, req):
        # no launcher here: answer with a namespace name, launch nothing
        req.reply(C.SUCCESS, "pydvm-spawned@1")

    def abort(self, req):
        req.reply(C.SUCCESS)

    def query(self, req):
        """pmix.qry.ns: "a,b"; pmix.qry.ptable: one row for the qualifier's
        namespace; anything else is not supported."""
        from pydvm.pmix.values import DataArray, ProcInfo
        items = []
        for q in req.queries:
            for key in q.keys:
                if key == "pmix.qry.ns":
                    items.append((key, Value("a,b", C.STRING)))
                elif key == "pmix.qry.ptable":
                    ns = q.qualifiers["pmix.nspace"].value
                    row = ProcInfo(Proc(ns, 7), "nodeX", "/bin/prog", 4242, 3, 20)
                    items.append((key, Value(DataArray(38, (row,)), C.DATA_ARRAY)))
        req.reply(C.SUCCESS if items else C.ERR_NOT_SUPPORTED, items)


async def run(spec: dict) -> dict:
    loop = asyncio.get_running_loop()
    server = PmixServer(**({"max_value_size": spec["max_value_size"]}
                           if "max_value_size" in spec else {}))
    host = DictHost(server, spec)
    server.start(spec.get("tmpdir"), loop, host,
                 answer_now=host.answer_now if spec.get("answer_now") else None)
    report: dict = {"clients": []}
    try:
        nspace = spec.get("nspace", "pydvm-test@1")
        node = spec.get("node", "node0")
        clients = spec["clients"]
        nodes = spec.get("nodes") or {node: sorted(c["rank"] for c in clients)}
        layout = JobLayout(nspace, nodes, apps=spec.get("apps"), session_id=spec.get("session"))
        info = job_info(layout, node, server=server if spec.get("regex") else None)
        host.local_ranks = set(nodes.get(node, ()))
        await server.register_nspace(nspace, layout.local_count(node), info)
        report["tmpdir"] = server.tmpdir
        image = os.path.join(server.tmpdir, "hwloc.sm")
        report["topology_image"] = image
        report["topology_image_mode"] = (os.stat(image).st_mode & 0o777
                                         if os.path.exists(image) else None)
        procs = []
        for c in clients:
            proc = Proc(nspace, c["rank"])
            await server.register_client(proc, c.get("uid", os.getuid()),
                                         c.get("gid", os.getgid()))
            env = dict(os.environ)
            env.update(server.setup_fork(proc))
            env.update(spec.get("env", {}))
            env.update(c.get("env", {}))
            if c.get("delay"):
                await asyncio.sleep(c["delay"])
            p = await asyncio.create_subprocess_exec(
                *c["argv"], env=env, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            procs.append((c, proc, p))

        async def reap(c, proc, p):
            try:
                out, err = await asyncio.wait_for(p.communicate(), spec.get("timeout", 30))
                rc = p.returncode
            except asyncio.TimeoutError:
                p.kill()
                out, err = await p.communicate()
                rc = "timeout"
            # a client that died without PMIx_Finalize sends no upcall:
            # the host deregisters it when it reaps the process
            server.deregister_client(proc)
            return {"rank": c["rank"], "rc": rc, "stdout": out.decode(errors="replace"),
                    "stderr": err.decode(errors="replace")[-4000:]}

        report["clients"] = await asyncio.gather(*(reap(*x) for x in procs))
        await asyncio.sleep(0.05)       # let trailing upcalls (finalize) arrive
        await server.deregister_nspace(nspace)
    finally:
        report["requests"] = host.log
        report["parked"] = len(host.parked)
        report["now"] = host.now
        report["stats"] = dict(server.stats)
        report["attribute_fix"] = getattr(server, "attribute_fix", None)
        guard = getattr(server, "client_guard", None)
        report["client_guard"] = (None if guard is None else
                                  {"state": guard.state, "refused": guard.refused})
        report["pending_replies"] = server.pending_replies
        for req, timer in host.parked:
            if timer:
                timer.cancel()
        host.parked.clear()
        server.finalize()
    return report


def main() -> int:
    logging.basicConfig(level=os.environ.get("HARNESS_LOG", "WARNING"), stream=sys.stderr)
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    t0 = time.monotonic()
    report = asyncio.run(run(spec))
    report["elapsed"] = time.monotonic() - t0
    print("REPORT " + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
