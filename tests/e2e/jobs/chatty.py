"""Write 64 KiB lines to stdout as fast as the pipe takes them, for ever."""

import sys

line = b"x" * (64 * 1024 - 1) + b"\n"
out = sys.stdout.buffer
while True:
    out.write(line)
