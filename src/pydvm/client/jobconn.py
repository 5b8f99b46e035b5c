"""The job API's connection to a DVM's master, and starting a DVM of one's own.

What :func:`pydvm.client.jobs.connect` and :func:`~pydvm.client.jobs.start`
do before there is a :class:`~pydvm.client.jobs.Dvm`: reach the master as
``pydvm run`` does (:func:`pydvm.cli.submit.connect_socket`: the DVM's
secret, or a multi-user DVM's tool socket), answer its challenge, and run
``pydvm start --daemonize``.
"""

from __future__ import annotations

from ..errors import UnreachableError
from ..protocol import DvmUri, FrameDecoder, FrameError, mac, pack

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def open_tool(uri: "str | None", timeout: float) -> tuple[Any, DvmUri, str, FrameDecoder, list]:
    """A connection to the master of the DVM at ``uri`` (default
    ``$PYDVM_URI``), let in as a tool: the socket (blocking), the URI, the
    master's name for messages, the frame decoder and what came after the
    welcome.  UnreachableError if no DVM answers or it refuses us."""
    from ..cli.submit import connect_socket
    from ..cli.toolcommon import ToolError, resolve_uri

    try:
        parsed = resolve_uri(uri)
        sock, secret, name = connect_socket(parsed)
    except ToolError as exc:
        raise UnreachableError(str(exc)) from None
    try:
        dec, early = _handshake(sock, parsed, secret, name, timeout)
    except BaseException:
        sock.close()
        raise
    return sock, parsed, name, dec, early


def _handshake(sock: Any, uri: DvmUri, secret: bytes | None, name: str,
               timeout: float) -> tuple[FrameDecoder, list]:
    """Answer the master's challenge; the decoder and whatever came after
    the welcome (raises UnreachableError if we are not let in)."""
    sock.settimeout(timeout)
    dec = FrameDecoder()
    msgs: list = []

    def next_msg() -> dict:
        while not msgs:
            try:
                data = sock.recv(1 << 16)
            except OSError as exc:
                raise UnreachableError(f"{name} closed: {exc}") from None
            if not data:
                raise UnreachableError(f"{name} closed the connection")
            try:
                msgs.extend(dec.feed(data))
            except FrameError as exc:
                raise UnreachableError(f"{name}: protocol error: {exc}") from None
        return msgs.pop(0)

    challenge = next_msg()
    if challenge.get("t") != "challenge" or not isinstance(challenge.get("nonce"), bytes):
        raise UnreachableError(f"{name} sent no challenge")
    if challenge.get("dvm") != uri.dvmid:
        raise UnreachableError(f"{uri.host}:{uri.port} is DVM {challenge.get('dvm')}, "
                               f"not {uri.dvmid}")
    auth: dict = {"t": "auth", "id": 0, "role": "tool"}
    if secret is not None:
        auth["mac"] = mac(secret, challenge["nonce"], "tool")
    try:
        sock.sendall(pack(auth))
    except OSError as exc:
        raise UnreachableError(f"{name} closed: {exc}") from None
    welcome = next_msg()
    if welcome.get("status") != 0:
        raise UnreachableError(f"master refused the connection: {welcome.get('msg')}")
    sock.settimeout(None)
    return dec, msgs



def start_dvm(hosts: Any, params: dict[str, Any], args: Any, timeout: float) -> str:
    """Run ``pydvm start --daemonize`` (see :func:`pydvm.client.jobs.start`);
    the URI it prints.  RuntimeError with its words if it fails."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "pydvm", "start", "--daemonize"]
    if hosts is not None:
        argv += ["--hosts", hosts if isinstance(hosts, str) else ",".join(hosts)]
    for k, v in params.items():
        argv += ["--mca", k, str(v)]
    argv += list(args)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0 or not p.stdout.strip():
        raise RuntimeError(p.stderr.strip() or f"pydvm start exited {p.returncode}")
    return p.stdout.strip().splitlines()[-1]


def stop_dvm(uri: str, timeout: float) -> None:
    """``pydvm stop`` the DVM at ``uri`` (a start whose connection failed)."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "pydvm", "stop", "--dvm", uri],
                   capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
