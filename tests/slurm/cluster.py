"""A real Slurm cluster on this one machine, for tests.

Use from a test (fixtures in conftest.py)::

    def test_x(slurm):                      # the module's 3-node cluster
        r = slurm.salloc("srun", "--ntasks-per-node=1", "hostname")  # salloc -N3 CMD
        r, out = slurm.sbatch_wait("#!/bin/sh\nhostname\n", "--nodes=3")
        with slurm.allocation(nodes=3) as job:                # salloc --no-shell
            p = slurm.popen("srun", f"--jobid={job}", "-N3", "sleep", "60")
            slurm.steps()                    # squeue --steps, parsed
            slurm.find("sn2", r"sleep 60")   # PIDs of matching processes on sn2
        slurm.env, slurm.nodes, slurm.addresses, slurm.head_addr, slurm.host_names

``SlurmCluster(names=("a", "b", "c"))`` names the Slurm nodes (and their
hostnames) a, b, c while their namespaces keep the ``prefix`` names (sn1..):
tests written for hosts a, b, c then run unchanged on Slurm nodes, and no
namespace ever takes a name another suite uses.

Bring-up takes about 1.3 s once the packages are installed, tear-down about
0.2 s.  Needs root and the Debian packages ``slurmctld slurmd slurm-client
munge`` (:func:`unavailable_reason` says what is missing).

Layout (defaults; ``tag`` picks the subnet and link names and ``prefix`` the
node names, so several clusters can coexist: the suite uses tag 7 for the
module clusters, 8 and 9 for the extra ones)::

    root namespace (the "host side", where salloc/sbatch/srun and the pydvm
    master run)
      bridge pdvmslurm<tag>-br  10.251.<tag>.1/24   names: snhead, <hostname>
      munged          own key, own socket dir (mode 0755), foreground
      slurmctld       own UTS namespace (hostname snhead) + mount namespace
                      (private hosts file); listens on a free TCP port
    network namespace sn1  10.251.<tag>.11  slurmd -D (node sn1)
    network namespace sn2  10.251.<tag>.12  slurmd -D (node sn2)
    network namespace sn3  10.251.<tag>.13  slurmd -D (node sn3)

Each slurmd is started as ``nsenter --net=/run/netns/NODE unshare --uts
--mount`` so it gets its own hostname and a private mount namespace, in which

* ``/sys/fs/cgroup`` is an empty tmpfs with an empty named cgroup-v1
  hierarchy at ``/sys/fs/cgroup/systemd`` (slurmd 22.05 insists on
  initialising a cgroup plugin and refuses hybrid v1/v2 hosts; with
  ``proctrack/linuxproc`` and ``task/none`` it never uses the hierarchy);
* ``/etc/hosts`` is a bind-mounted private file that knows every node and
  the host side (``snhead`` and this machine's hostname both map to the
  bridge address), so anything a step runs resolves names like on a cluster.

``ip netns exec`` is not used for the daemons: it remounts ``/sys`` and would
hide the cgroup trick.  Every process the cluster starts is recorded by PID
and every namespace/link it creates by name; :meth:`SlurmCluster.down`
removes exactly those, whatever state bring-up reached; SIGTERM to the test
process unwinds into it too.  Nothing outside the cluster's own temporary
directory, namespaces and links is touched.  A lock file per tag
(``/tmp/pdvm-slurm<tag>.lock``, left in place) refuses a second cluster with
the same names and, once held, proves that anything still carrying them is a
leftover of a killed run, which bring-up then clears.

Slurm clients find the cluster through ``SLURM_CONF`` (see
:attr:`SlurmCluster.env`); the munge socket is named in slurm.conf
(``AuthInfo=socket=...``), so the machine's own munge/Slurm set-up, if any,
is neither used nor disturbed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

IP = shutil.which("ip") or "/usr/sbin/ip"
SBIN = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")

#: what must be installed: Debian 12 packages slurmctld slurmd slurm-client munge
#: (+ iproute2 and util-linux, normally present).
NEEDED = {
    "slurmctld": "slurmctld", "slurmd": "slurmd", "srun": "slurm-client",
    "salloc": "slurm-client", "sbatch": "slurm-client", "squeue": "slurm-client",
    "scancel": "slurm-client", "sinfo": "slurm-client", "scontrol": "slurm-client",
    "munged": "munge", "mungekey": "munge", "nsenter": "util-linux",
    "unshare": "util-linux", "ip": "iproute2",
}


def _which(prog: str) -> str | None:
    return shutil.which(prog, path=os.pathsep.join([os.environ.get("PATH", ""), *SBIN]))


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([IP, *args], capture_output=True, text=True, timeout=30, check=check)


def unavailable_reason() -> str:
    """'' if a cluster can be made here, else why not (for ``pytest.skip``)."""
    if os.geteuid() != 0:
        return "a Slurm test cluster needs root (network/mount/UTS namespaces; CI runs as root)"
    missing = sorted({pkg for prog, pkg in NEEDED.items() if not _which(prog)})
    if missing:
        return ("Slurm test cluster: missing packages "
                f"(apt-get install --no-install-recommends {' '.join(missing)})")
    name = f"pdvmslprobe{os.getpid()}"
    p = _ip("netns", "add", name, check=False)
    if p.returncode != 0:
        return f"cannot create a network namespace: {p.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return ""


class ClusterError(RuntimeError):
    """Bring-up failed; the message carries the daemons' logs."""


@dataclass
class Step:
    """One line of ``squeue --steps``."""

    job_id: int
    step_id: str  # "0", "1", ... or "batch", "extern", "interactive"
    name: str
    nodes: str  # compressed node list, as squeue prints it
    tasks: int

    @property
    def id(self) -> str:
        return f"{self.job_id}.{self.step_id}"


@dataclass
class SlurmCluster:
    """A 3-node Slurm cluster.  Use as a context manager; always cleans up."""

    n: int = 3
    #: third octet of the subnet 10.251.<tag>.0/24 and part of link names.
    tag: int = 7
    #: network namespace name prefix: sn1, sn2, ... (also the node names unless ``names``)
    prefix: str = "sn"
    #: Slurm node names, if not the namespaces' (``("a", "b", "c")`` lets tests written
    #: for hosts a, b, c run unchanged; the namespaces keep their ``prefix`` names, so
    #: they never collide with other suites' namespaces of those names).
    names: tuple[str, ...] = ()
    #: CPUs each node claims (slurm.conf, with ``config_overrides``).
    cpus: int | tuple[int, ...] = 2
    #: seconds between SIGTERM and SIGKILL when a job/step ends (slurm.conf KillWait).
    kill_wait: int = 5
    #: seconds without a response before slurmctld declares a node DOWN (slurm.conf).
    slurmd_timeout: int = 300
    #: seconds to wait for every node to be idle.
    up_timeout: float = 30.0
    head_name: str = "snhead"

    dir: Path | None = None
    port: int = 0
    #: PIDs this cluster started (daemons), name -> Popen.
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    netns_made: list[str] = field(default_factory=list)
    links_made: list[str] = field(default_factory=list)
    clients: list[subprocess.Popen] = field(default_factory=list)
    #: the directory of the latest bring-up, kept after down() for :meth:`leftovers`.
    last_dir: Path | None = None
    up_seconds: float = 0.0
    down_seconds: float = 0.0

    # -- naming --------------------------------------------------------------------------
    @property
    def nodes(self) -> list[str]:
        """Slurm node names (hostnames inside the nodes), in order."""
        if self.names:
            assert len(self.names) == self.n, "one name per node"
            return list(self.names)
        return self.netns_names

    @property
    def netns_names(self) -> list[str]:
        """The nodes' network namespaces, in node order."""
        return [f"{self.prefix}{i}" for i in range(1, self.n + 1)]

    def netns(self, node: str) -> str:
        """The network namespace of node ``node``."""
        return self.netns_names[self.nodes.index(node)]

    @property
    def bridge(self) -> str:
        return f"pdvmslurm{self.tag}-br"

    @property
    def head_addr(self) -> str:
        """The host side's address on the bridge: what nodes use to reach the master."""
        return f"10.251.{self.tag}.1"

    @property
    def host_names(self) -> list[str]:
        """Names that resolve to :attr:`head_addr` on every node."""
        names = [self.head_name]
        me = socket.gethostname()
        if me and me not in names:
            names.append(me)
        return names

    @property
    def addresses(self) -> dict[str, str]:
        return {name: f"10.251.{self.tag}.{10 + i}" for i, name in enumerate(self.nodes, 1)}

    def _veth(self, i: int) -> str:
        return f"pdvmslurm{self.tag}-v{i}"

    def _peer(self, i: int) -> str:
        return f"pdvmslurm{self.tag}-p{i}"

    def _cpus(self, i: int) -> int:
        return self.cpus if isinstance(self.cpus, int) else self.cpus[i - 1]

    @property
    def conf(self) -> Path:
        assert self.dir is not None
        return self.dir / "etc" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        assert self.dir is not None
        return self.dir / "munge" / "munge.socket.2"

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm client commands (and for anything that calls them)."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "SALLOC_", "SBATCH_", "SRUN_", "SQUEUE_"))}
        env["SLURM_CONF"] = str(self.conf)
        path = env.get("PATH", "").split(os.pathsep)
        env["PATH"] = os.pathsep.join(path + [p for p in SBIN if p not in path])
        return env

    # -- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> "SlurmCluster":
        self._catch_sigterm()
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def _catch_sigterm(self) -> None:
        """Make SIGTERM (``timeout``, a CI runner stopping us) unwind, so down() runs.

        Only where nobody else handles SIGTERM; down() puts the old handler back.
        """
        self._old_sigterm = None
        try:
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                self._old_sigterm = signal.signal(signal.SIGTERM, _sigterm_to_exit)
        except ValueError:  # not the main thread
            pass

    def up(self) -> None:
        t0 = time.monotonic()
        self._lock()
        self._clear_stale()
        self.dir = Path(tempfile.mkdtemp(prefix=self._dir_prefix))
        self.dir.chmod(0o755)
        self.last_dir = self.dir
        for sub in ("etc", "log", "state", "spool", "run", "munge", "out"):
            (self.dir / sub).mkdir(mode=0o755)
        (self.dir / "out").chmod(0o1777)
        for node in self.nodes:
            (self.dir / "spool" / node).mkdir(mode=0o755)
        self._network()
        self.port = _free_port()
        self._write_config()
        self._start_munged()
        self._start_slurmctld()
        for i, node in enumerate(self.nodes, 1):
            self._start_slurmd(i, node)
        self.wait_idle(self.up_timeout)
        self.up_seconds = time.monotonic() - t0

    def down(self) -> None:
        """Remove everything :meth:`up` made, whatever state it reached."""
        t0 = time.monotonic()
        for p in self.clients:
            _kill_tree(p, grace=0.0)
        # Slurm daemons first (slurmctld would otherwise see nodes vanish and
        # log about it), then everything left in the nodes' namespaces --
        # slurmstepd and tasks, including ones that setsid'ed or double-forked.
        for name in [n for n in self.procs if n != "munged"]:
            _kill(self.procs[name].pid, signal.SIGKILL)
        for ns in self.netns_made:
            for pid in _netns_pids(ns):
                _kill(pid, signal.SIGKILL)
        if "munged" in self.procs:
            _kill(self.procs["munged"].pid, signal.SIGTERM)
        if self.dir is not None:  # anything else that escaped but names our files
            ours = {p.pid for p in self.procs.values()}
            for pid, _ in _procs_naming(self.dir):
                if pid not in ours:
                    _kill(pid, signal.SIGKILL)
        for name, p in self.procs.items():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _kill(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        for p in self.clients:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for ns in self.netns_made:
            deadline = time.monotonic() + 5
            while _netns_pids(ns) and time.monotonic() < deadline:
                for pid in _netns_pids(ns):
                    _kill(pid, signal.SIGKILL)
                time.sleep(0.05)
            _ip("netns", "del", ns, check=False)
        for link in reversed(self.links_made):
            _ip("link", "del", link, check=False)
        self.procs.clear()
        self.clients.clear()
        self.netns_made.clear()
        self.links_made.clear()
        if self.dir is not None and not os.environ.get("PYDVM_KEEP_SLURM_DIR"):
            shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None
        self._unlock()
        if getattr(self, "_old_sigterm", None) is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None
        self.down_seconds = time.monotonic() - t0

    @property
    def _dir_prefix(self) -> str:
        return f"pdvm-slurm{self.tag}-"

    def _lock(self) -> None:
        """One cluster per tag on this machine: the names (namespaces, links) are fixed.

        Holding the lock also proves that whatever carries this tag's names
        is a leftover of a crashed run, safe to clear.
        """
        path = Path(tempfile.gettempdir()) / f"pdvm-slurm{self.tag}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ClusterError(f"another Slurm test cluster with tag {self.tag} is running on "
                               f"this machine (lock {path} is held)") from None
        self._lock_fd = fd

    def _unlock(self) -> None:
        fd = getattr(self, "_lock_fd", None)
        if fd is not None:
            os.close(fd)  # releases the flock
            self._lock_fd = None

    def _clear_stale(self) -> None:
        """Leftovers of a crashed earlier run with this tag (ours only: we hold the lock)."""
        tmp = os.path.join(tempfile.gettempdir(), self._dir_prefix).encode()
        for pid in _all_pids():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if tmp in cmd and pid != os.getpid():
                _kill(pid, signal.SIGKILL)
        for old in Path(tempfile.gettempdir()).glob(f"{self._dir_prefix}*"):
            shutil.rmtree(old, ignore_errors=True)
        listed = _ip("netns", "list", check=False).stdout.split("\n")
        existing = {line.split()[0] for line in listed if line.split()}
        for ns in self.netns_names:
            if ns in existing:
                for pid in _netns_pids(ns):
                    _kill(pid, signal.SIGKILL)
                _ip("netns", "del", ns, check=False)
        for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
            parts = line.split(":")
            if len(parts) > 1:
                dev = parts[1].strip().split("@")[0]
                if dev.startswith(f"pdvmslurm{self.tag}-"):
                    _ip("link", "del", dev, check=False)

    def _network(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self.links_made.append(self.bridge)
        _ip("addr", "add", f"{self.head_addr}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, ns in enumerate(self.netns_names, 1):
            _ip("netns", "add", ns)
            self.netns_made.append(ns)
            _ip("link", "add", self._veth(i), "type", "veth", "peer", "name", self._peer(i))
            self.links_made.append(self._veth(i))
            _ip("link", "set", self._peer(i), "netns", ns)
            _ip("-n", ns, "link", "set", self._peer(i), "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{self.addresses[self.nodes[i - 1]]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("link", "set", self._veth(i), "master", self.bridge)
            _ip("link", "set", self._veth(i), "up")

    def _write_config(self) -> None:
        d = self.dir
        assert d is not None
        hosts = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
                 f"{self.head_addr}\t{' '.join(self.host_names)}"]
        hosts += [f"{addr}\t{name}" for name, addr in self.addresses.items()]
        (d / "etc" / "hosts").write_text("\n".join(hosts) + "\n")
        nodes = "\n".join(
            f"NodeName={name} NodeAddr={addr} NodeHostname={name} CPUs={self._cpus(i)} "
            f"State=UNKNOWN"
            for i, (name, addr) in enumerate(self.addresses.items(), 1))
        self.conf.write_text(textwrap.dedent(f"""\
            # Generated by tests/slurm/cluster.py: a throw-away test cluster.
            ClusterName=pdvmtest{self.tag}
            SlurmctldHost={self.head_name}({self.head_addr})
            SlurmctldPort={self.port}
            SlurmdPort=6818
            SlurmUser=root
            SlurmdUser=root
            AuthType=auth/munge
            CredType=cred/munge
            AuthInfo=socket={self.munge_socket}
            StateSaveLocation={d}/state
            SlurmdSpoolDir={d}/spool/%n
            SlurmctldPidFile={d}/run/slurmctld.pid
            SlurmdPidFile={d}/run/slurmd-%n.pid
            SlurmctldLogFile={d}/log/slurmctld.log
            SlurmdLogFile={d}/log/slurmd-%n.log
            SlurmctldDebug=info
            SlurmdDebug=info
            ProctrackType=proctrack/linuxproc
            TaskPlugin=task/none
            JobAcctGatherType=jobacct_gather/none
            AccountingStorageType=accounting_storage/none
            JobCompType=jobcomp/none
            SwitchType=switch/none
            MpiDefault=none
            SelectType=select/cons_tres
            SelectTypeParameters=CR_Core
            SlurmdParameters=config_overrides
            ReturnToService=2
            InactiveLimit=0
            KillWait={self.kill_wait}
            MinJobAge=30
            MessageTimeout=10
            SlurmdTimeout={self.slurmd_timeout}
            MailProg=/bin/true
            PlugStackConfig={d}/etc/plugstack.conf
            {nodes}
            PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
            """))
        (d / "etc" / "plugstack.conf").write_text("")
        (d / "etc" / "cgroup.conf").write_text(
            "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n"
            "ConstrainCores=no\nConstrainRAMSpace=no\nConstrainDevices=no\n")

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        assert self.dir is not None
        out = open(self.dir / "log" / f"{name}.out", "ab")
        try:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True,
                                 env=self.env)
        finally:
            out.close()
        self.procs[name] = p
        return p

    def _start_munged(self) -> None:
        assert self.dir is not None
        m = self.dir / "munge"
        key = m / "munge.key"
        subprocess.run([_which("mungekey") or "mungekey", "-c", "-k", str(key)],
                       check=True, capture_output=True, timeout=30)
        key.chmod(0o600)
        self._spawn("munged", [
            _which("munged") or "munged", "-F", f"--socket={self.munge_socket}",
            f"--key-file={key}", f"--pid-file={m}/munged.pid",
            f"--log-file={self.dir}/log/munged.log", f"--seed-file={m}/munged.seed",
            "--num-threads=4"])
        deadline = time.monotonic() + 10
        while not self.munge_socket.exists():
            if self.procs["munged"].poll() is not None or time.monotonic() > deadline:
                raise ClusterError("munged did not start\n" + self.logs())
            time.sleep(0.02)

    def _private_ns_script(self, hostname: str, node_cgroup: bool) -> str:
        assert self.dir is not None
        lines = ["set -e", f"hostname {hostname}",
                 f"mount --bind {self.dir}/etc/hosts /etc/hosts"]
        if node_cgroup:
            lines += [
                "mount -t tmpfs -o mode=755 pdvmslurm /sys/fs/cgroup",
                "mkdir /sys/fs/cgroup/systemd",
                f"mount -t cgroup -o none,name=pdvmslurm{self.tag}{hostname} pdvmslurm "
                "/sys/fs/cgroup/systemd",
            ]
        return "\n".join(lines) + "\n"

    def _start_slurmctld(self) -> None:
        script = self._private_ns_script(self.head_name, node_cgroup=False)
        script += f'exec {_which("slurmctld")} -D -i -f {self.conf}\n'
        self._spawn("slurmctld", [_which("unshare") or "unshare", "--uts", "--mount",
                                  "--propagation", "private", "sh", "-c", script])

    def _start_slurmd(self, i: int, node: str) -> None:
        script = self._private_ns_script(node, node_cgroup=True)
        script += f'exec {_which("slurmd")} -D -N {node} -f {self.conf}\n'
        self._spawn(f"slurmd-{node}", [
            _which("nsenter") or "nsenter", f"--net=/run/netns/{self.netns(node)}", "--",
            _which("unshare") or "unshare", "--uts", "--mount", "--propagation", "private",
            "sh", "-c", script])

    def wait_idle(self, timeout: float) -> None:
        """Wait until ``sinfo`` shows every node idle; ClusterError with logs if not."""
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise ClusterError(f"{name} exited with status {p.returncode} during "
                                       f"bring-up\n{self.logs()}")
            r = self.run("sinfo", "--noheader", "--Node", "--format=%N %t", timeout=10)
            last = (r.stdout + r.stderr).strip()
            states = dict(line.split()[:2] for line in r.stdout.splitlines() if line.split())
            if r.returncode == 0 and all(states.get(n) == "idle" for n in self.nodes):
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"nodes not idle after {timeout:.0f} s; last sinfo: "
                                   f"{last!r}\n{self.logs()}")
            time.sleep(0.1)

    def logs(self, tail: int = 40) -> str:
        """The last lines of every daemon's log and captured output."""
        if self.dir is None:
            return "(no cluster directory)"
        out = []
        for f in sorted((self.dir / "log").glob("*")):
            try:
                lines = f.read_text(errors="replace").splitlines()[-tail:]
            except OSError as e:
                lines = [f"(unreadable: {e})"]
            out.append(f"--- {f.name} ---\n" + "\n".join(lines))
        return "\n".join(out)

    # -- running things ------------------------------------------------------------------
    def run(self, *argv: str, timeout: float = 60, input: str | None = None,
            check: bool = False, env: dict[str, str] | None = None,
            cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
        """Run a command (srun, salloc, squeue...) on the host side with :attr:`env`.

        On timeout the command and all its descendants are ended (see
        :func:`_kill_tree`) and ``subprocess.TimeoutExpired`` raised.
        """
        p = self.popen(*argv, env=env, cwd=cwd,
                       stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL)
        try:
            out, err = p.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(p)
            try:
                out, err = p.communicate(timeout=5)
            except subprocess.TimeoutExpired:  # something holds its pipes still
                out, err = "", ""
            raise subprocess.TimeoutExpired(list(argv), timeout, out, err) from None
        finally:
            if p in self.clients and p.returncode is not None:
                self.clients.remove(p)
        r = subprocess.CompletedProcess(list(argv), p.returncode, out, err)
        if check and r.returncode:
            raise subprocess.CalledProcessError(r.returncode, list(argv), out, err)
        return r

    def popen(self, *argv: str, env: dict[str, str] | None = None,
              cwd: str | os.PathLike | None = None, stdin=subprocess.DEVNULL,
              stdout=subprocess.PIPE, stderr=subprocess.PIPE) -> subprocess.Popen:
        """Start a command in the background (own process group, killed at teardown).

        It runs in the cluster's ``out`` directory unless ``cwd`` is given
        (Slurm tasks start in the submitting command's directory).
        """
        if cwd is None and self.dir is not None:
            cwd = self.dir / "out"  # tasks chdir to the submit dir: keep them out of the repo
        p = subprocess.Popen(list(argv), env={**self.env, **(env or {})}, cwd=cwd,
                             stdin=stdin, stdout=stdout, stderr=stderr, text=True,
                             start_new_session=True)
        self.clients.append(p)
        return p

    def salloc(self, *cmd: str, nodes: int | None = None, args: tuple[str, ...] = (),
               timeout: float = 60, input: str | None = None) -> subprocess.CompletedProcess:
        """Run ``cmd`` on the host side inside a fresh allocation (``salloc -N n cmd``)."""
        return self.run("salloc", f"--nodes={nodes or self.n}", *args, *cmd,
                        timeout=timeout, input=input)

    @contextlib.contextmanager
    def allocation(self, nodes: int | None = None, args: tuple[str, ...] = (),
                   timeout: float = 30):
        """A held allocation (``salloc --no-shell``): yields its job id, cancels it at exit.

        Start steps in it with ``popen("srun", f"--jobid={job}", ...)``.
        """
        r = self.run("salloc", "--no-shell", f"--nodes={nodes or self.n}", *args,
                     timeout=timeout)
        m = re.search(r"Granted job allocation (\d+)", r.stderr)
        if r.returncode or not m:
            raise AssertionError(f"salloc --no-shell failed ({r.returncode}): {r.stderr}")
        job = int(m.group(1))
        try:
            yield job
        finally:
            # steps first: ``scancel JOB.STEP`` kills at once, where ending the
            # job would give every task KillWait seconds after SIGTERM
            for step in self.steps():
                if step.job_id == job:
                    self.run("scancel", step.id, timeout=20)
            self.run("scancel", str(job), timeout=20)
            self.wait_for(lambda: job not in self.jobs(), timeout=self.kill_wait + 30,
                          what=f"job {job} to leave the queue")

    def sbatch_wait(self, script: str, *args: str, timeout: float = 60
                    ) -> tuple[subprocess.CompletedProcess, str]:
        """Submit ``script`` with sbatch and wait for the job to end; return the
        result (``returncode`` is the job's exit code, as ``sbatch --wait`` gives
        it) and the job's output.

        The job's end is polled here every 0.1 s with ``scontrol show job``:
        ``sbatch --wait`` itself checks only every 10 s or so, which made every
        batch test take at least that long.
        """
        assert self.dir is not None
        fd, path = tempfile.mkstemp(prefix="job-", suffix=".sh", dir=self.dir / "out")
        with os.fdopen(fd, "w") as f:
            f.write(script)
        os.chmod(path, 0o755)
        out = f"{path}.%j.out"
        r = self.run("sbatch", "--parsable", f"--output={out}", *args, path, timeout=timeout)
        job = r.stdout.strip().split(";")[0]
        if r.returncode or not job.isdigit():
            return r, ""
        deadline = time.monotonic() + timeout
        while True:
            show = self.run("scontrol", "show", "job", "--oneliner", job, timeout=20).stdout
            state = re.search(r"\bJobState=(\S+)", show)
            code = re.search(r"\bExitCode=(\d+):(\d+)", show)
            if state and code and state.group(1) not in ("PENDING", "CONFIGURING", "RUNNING",
                                                         "COMPLETING", "SUSPENDED"):
                status, sig = int(code.group(1)), int(code.group(2))
                break
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(["sbatch", path], timeout)
            time.sleep(0.1)
        try:
            text = Path(out.replace("%j", job)).read_text()
        except FileNotFoundError:
            text = ""
        result = subprocess.CompletedProcess(r.args, 128 + sig if sig else status, r.stdout,
                                             r.stderr + f"job {job}: {state.group(1)}\n")
        return result, text

    def steps(self) -> list[Step]:
        """Every job step ``squeue --steps`` shows (all users)."""
        r = self.run("squeue", "--steps", "--noheader", "--format=%i|%j|%N|%A", check=True,
                     timeout=20)
        out = []
        for line in r.stdout.splitlines():
            if not line.strip():
                continue
            sid, name, nodes, tasks = line.strip().split("|")
            job, _, step = sid.partition(".")
            out.append(Step(int(job), step, name, nodes, int(tasks) if tasks.isdigit() else 0))
        return out

    def jobs(self) -> dict[int, str]:
        """Job id -> state (PENDING, RUNNING, COMPLETING...) of every job in the queue."""
        r = self.run("squeue", "--noheader", "--format=%i %T", check=True, timeout=20)
        return {int(a): b for a, b in (line.split() for line in r.stdout.splitlines()
                                       if line.strip())}

    def cancel_all(self, timeout: float = 30) -> None:
        """Cancel every job and wait until the queue is empty."""
        self.run("scancel", "--full", "--user=root", timeout=20)
        deadline = time.monotonic() + timeout
        while self.jobs():
            if time.monotonic() > deadline:
                raise AssertionError(f"jobs still queued: {self.jobs()}")
            time.sleep(0.2)

    # -- looking at nodes ----------------------------------------------------------------
    def node_pid(self, node: str) -> int:
        """PID of ``node``'s slurmd (its namespaces are the node's)."""
        return self.procs[f"slurmd-{node}"].pid

    def in_node(self, node: str, *argv: str, timeout: float = 30,
                input: str | None = None) -> subprocess.CompletedProcess:
        """Run a command on ``node``: its network, hostname and mount namespace."""
        return subprocess.run(
            [_which("nsenter") or "nsenter", "-t", str(self.node_pid(node)), "--net", "--uts",
             "--mount", "--", *argv], capture_output=True, text=True, timeout=timeout,
            input=input, env=self.env)

    def kill_node(self, node: str) -> None:
        """The node dies: SIGKILL to every process on it (slurmd, slurmstepd, tasks).

        Its namespaces stay (an unreachable host, as far as slurmctld can
        tell); :meth:`down` removes them with the rest.
        """
        for _ in range(3):  # catch anything forked while we were killing
            for pid in _netns_pids(self.netns(node)):
                _kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    def restart_node(self, node: str, timeout: float = 30) -> None:
        """Start a killed node's slurmd again (fresh mount/UTS namespaces, same
        network namespace) and wait until the node is idle again."""
        old = self.procs.pop(f"slurmd-{node}", None)
        if old is not None:
            _kill(old.pid, signal.SIGKILL)
            old.wait(timeout=10)
        self._start_slurmd(self.nodes.index(node) + 1, node)
        self.run("scontrol", "update", f"NodeName={node}", "State=RESUME", timeout=20)
        self.wait_idle(timeout)

    def processes(self, node: str) -> list[tuple[int, list[str]]]:
        """(pid, argv) of every process on ``node`` (in its network namespace)."""
        out = []
        for pid in _netns_pids(self.netns(node)):
            try:
                raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if raw and not _zombie(pid):
                out.append((pid, [a.decode(errors="replace") for a in raw.split(b"\0") if a]))
        return out

    def find(self, node: str, pattern: str) -> list[int]:
        """PIDs of processes on ``node`` whose command line matches regex ``pattern``."""
        rx = re.compile(pattern)
        return [pid for pid, argv in self.processes(node) if rx.search(" ".join(argv))]

    def wait_for(self, pred, timeout: float = 20, interval: float = 0.1, what: str = ""):
        """Poll ``pred()`` until truthy; return its value or raise AssertionError."""
        deadline = time.monotonic() + timeout
        while True:
            v = pred()
            if v:
                return v
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what or pred}")
            time.sleep(interval)

    # -- leftovers check ----------------------------------------------------------------
    def leftovers(self) -> list[str]:
        """What of this cluster still exists after :meth:`down`; [] if nothing.

        Looks for its namespaces, its links, its directory and any live
        process whose command line names that directory (munged, slurmctld,
        slurmd all do) -- never at anything else on the machine.
        """
        found = []
        listed = {line.split()[0] for line in _ip("netns", "list", check=False).stdout.split("\n")
                  if line.split()}
        found += [f"netns {ns}" for ns in self.netns_names if ns in listed]
        for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
            parts = line.split(":")
            if len(parts) > 1 and parts[1].strip().startswith(f"pdvmslurm{self.tag}-"):
                found.append(f"link {parts[1].strip()}")
        if self.last_dir is not None:
            if self.last_dir.exists():
                found.append(f"directory {self.last_dir}")
            found += [f"process {pid}: {cmd[:200]}" for pid, cmd in _procs_naming(self.last_dir)]
        return found


def _sigterm_to_exit(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for p in _all_pids():
        try:
            ppid = int(Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(p)
    out: set[int] = set()
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _kill_tree(p: subprocess.Popen, grace: float = 3.0) -> None:
    """End a client command and everything it started.

    SIGTERM first, so that salloc/srun can give back their allocation or
    step (a SIGKILLed salloc leaves its job running), then SIGKILL to the
    process group and to every descendant -- salloc runs its command in a
    process group of its own, and that command outlives salloc otherwise.
    """
    if p.poll() is not None:
        return
    tree = _descendants(p.pid)
    if grace > 0:
        _kill(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    tree |= _descendants(p.pid)
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in tree | {p.pid}:
        _kill(pid, signal.SIGKILL)


def _netns_pids(ns: str) -> list[int]:
    p = _ip("netns", "pids", ns, check=False)
    return [int(x) for x in p.stdout.split()] if p.returncode == 0 else []


def _zombie(pid: int) -> bool:
    """Dead but not yet reaped (by PID 1, which adopts slurmd's orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


def _procs_naming(dir: Path) -> list[tuple[int, str]]:
    """Live processes whose command line contains ``dir``."""
    key = str(dir).encode()
    out = []
    for pid in _all_pids():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if key in cmd and pid != os.getpid() and not _zombie(pid):
            out.append((pid, cmd.replace(b"\0", b" ").decode(errors="replace")))
    return out


def _all_pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def need_cluster() -> None:
    """Skip the calling test (with the reason) where no cluster can be made --
    or fail it under ``PYDVM_REQUIRE_SLURM=1``."""
    import pytest

    why = unavailable_reason()
    if not why:
        return
    if os.environ.get("PYDVM_REQUIRE_SLURM") == "1":
        pytest.fail(f"PYDVM_REQUIRE_SLURM=1 but no Slurm test cluster: {why}")
    pytest.skip(why)

