"""Prints FIRST, waits for the test's go file (argv[1]), prints SECOND."""

import sys

from _common import out, wait_file

out("FIRST")
out("SECOND" if wait_file(sys.argv[1]) else "NO GO FILE")
