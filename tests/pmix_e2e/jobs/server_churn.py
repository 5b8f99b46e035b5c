"""One PmixServer serving N short jobs in a row, as a node server does.

    server_churn.py TMPDIR CLIENT N [deregister-client]

Each round registers a new namespace (one local rank of two), registers the
client, runs CLIENT (it publishes one key and finalizes), then deregisters
the namespace -- and, with ``deregister-client``, the client first, right
after its exit.  Prints ``HANG <round>`` for a client stuck more than 10 s
and ``DONE <rounds> <hangs>`` at the end.
"""
import asyncio
import os
import sys

from pydvm.pmix import Handler, PmixServer, Proc
from pydvm.pmix.jobinfo import JobLayout, job_info


class Host(Handler):
    def publish(self, req):
        req.reply(0)


async def main(tmp: str, client: str, n: int, dereg: bool) -> None:
    srv = PmixServer()
    srv.start(tmp, asyncio.get_running_loop(), Host())
    hangs = 0
    try:
        for i in range(n):
            ns = f"churn@{i}"
            await srv.register_nspace(ns, 1, job_info(JobLayout(ns, {"n0": [0], "n1": [1]}), "n0"))
            proc = Proc(ns, 0)
            await srv.register_client(proc, os.getuid(), os.getgid())
            env = dict(os.environ, **srv.setup_fork(proc))
            p = await asyncio.create_subprocess_exec(client, "pub:k:string:v", env=env,
                                                     stdout=asyncio.subprocess.DEVNULL)
            try:
                await asyncio.wait_for(p.wait(), 10)
            except asyncio.TimeoutError:
                hangs += 1
                print(f"HANG {i}", flush=True)
                p.kill()
                await p.wait()
                if hangs >= 3:
                    break
            if dereg:
                srv.deregister_client(proc)
            await srv.deregister_nspace(ns)
    finally:
        srv.finalize()
    print(f"DONE {i + 1} {hangs}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]),
                     len(sys.argv) > 4 and sys.argv[4] == "deregister-client"))
