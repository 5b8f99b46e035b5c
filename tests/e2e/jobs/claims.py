"""Send a publish that claims another identity, straight on the wire.

A client's ``requestor`` / ``req_uid`` / ``req_gid`` claims must be ignored:
only tools may relay for another process.  Prints the reply's status.
"""

import os
import socket
import sys

from pydvm.channel import BlockingChannel

key = sys.argv[1]
sock = socket.socket(socket.AF_UNIX)
sock.connect(os.environ["PYDVM_SERVER"])
ch = BlockingChannel(sock)
ch.send({"t": "hello", "id": 1, "nspace": os.environ["PYDVM_NSPACE"],
         "rank": int(os.environ["PYDVM_RANK"])})
assert ch.recv(10)["status"] == 0
ch.send({"t": "publish", "id": 2, "pairs": {key: "claimed"}, "range": 4, "persist": 4,
         "requestor": ["somebody-else@1", 7], "req_uid": 4242, "req_gid": 4242})
print("STATUS", ch.recv(10)["status"], flush=True)
