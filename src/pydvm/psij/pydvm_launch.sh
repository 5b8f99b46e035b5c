#!/bin/bash
# PSI/J's "pydvm" launcher: the job's processes are started by `pydvm run`,
# on the DVM of $PYDVM_URI, else on a one-shot DVM (in a Slurm allocation,
# over its nodes).  Arguments after PSI/J's own (launcher_lib.sh): the
# process count, processes per node (0: the DVM's placement), the Python
# that has pydvm, then the executable and its arguments.

source $(dirname "$0")/launcher_lib.sh

_PSI_J_PROCESS_COUNT="$1"
_PSI_J_PPN="$2"
_PSI_J_PYTHON="$3"
shift 3

pre_launch

_PSI_J_PLACE=()
if [ "$_PSI_J_PPN" != "0" ]; then
    _PSI_J_PLACE=(--npernode "$_PSI_J_PPN")
fi

set +e
"$_PSI_J_PYTHON" -m pydvm run -n "$_PSI_J_PROCESS_COUNT" "${_PSI_J_PLACE[@]}" "$@" \
    1>"$_PSI_J_STDOUT" 2>"$_PSI_J_STDERR" <"$_PSI_J_STDIN"
_PSI_J_EC=$?
set -e
log "Command done: $_PSI_J_EC"

post_launch

echo "_PSI_J_LAUNCHER_DONE"
exit $_PSI_J_EC
