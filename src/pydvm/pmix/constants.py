"""PMIx numbers used by the binding: status codes, data types, attribute keys.

The values are those of the PMIx 4.2 headers (``pmix_common.h``).  They are
part of the PMIx standard's ABI and do not change between the library
versions this package accepts; the *struct layouts* are what the version
check in :mod:`pydvm.pmix._lib` guards.

Nothing here loads libpmix: this module is safe to import anywhere.
"""

from __future__ import annotations

# --------------------------------------------------------------------------
# Status codes (pmix_status_t, a C int)

SUCCESS = 0
ERROR = -1
ERR_EXISTS = -11
ERR_UNKNOWN_DATA_TYPE = -16
ERR_TYPE_MISMATCH = -18
ERR_NO_PERMISSIONS = -23
ERR_TIMEOUT = -24
ERR_UNREACH = -25
ERR_BAD_PARAM = -27
ERR_RESOURCE_BUSY = -28
ERR_OUT_OF_RESOURCE = -29
ERR_INIT = -31
ERR_NOMEM = -32
ERR_NOT_FOUND = -46
ERR_NOT_SUPPORTED = -47
ERR_COMM_FAILURE = -49
ERR_PARTIAL_SUCCESS = -52
ERR_DUPLICATE_KEY = -53
ERR_PARAM_VALUE_NOT_SUPPORTED = -59
ERR_LOST_CONNECTION = -61
ERR_PROC_ABORTED = -7          # (a deprecated name in 4.2; Open MPI 4.1's event for a failed process)
ERR_PROC_REQUESTED_ABORT = -8
EVENT_JOB_END = -145           # also PMIX_ERR_JOB_TERMINATED
DEBUGGER_RELEASE = -3          # releases processes a debugger holds (stopped in PMIx_Init)
READY_FOR_DEBUG = -58          # a process stopped for a debugger (PMIX_BREAKPOINT says where)
ERR_PROC_TERM_WO_SYNC = -200
EVENT_PROC_TERMINATED = -201
ERR_PROC_ABORTED_BY_SIG = -402
GROUP_CONSTRUCT_ABORT = -165
ERR_EXIT_NONZERO_TERM = -404
OPERATION_IN_PROGRESS = -156
OPERATION_SUCCEEDED = -157   # a blocking server call completed

STATUS_NAMES: dict[int, str] = {
    v: "PMIX_" + k
    for k, v in dict(globals()).items()
    if (k in ("SUCCESS", "ERROR") or k.startswith(("ERR_", "OPERATION_")))
    and isinstance(v, int)
}


def status_name(status: int) -> str:
    """``PMIX_ERR_NOT_FOUND`` for -46; ``PMIX_STATUS(<n>)`` for numbers we do not name."""
    return STATUS_NAMES.get(int(status), f"PMIX_STATUS({int(status)})")


# --------------------------------------------------------------------------
# Data types (pmix_data_type_t, uint16)

UNDEF = 0
BOOL = 1
BYTE = 2
STRING = 3
SIZE = 4
PID = 5
INT = 6
INT8 = 7
INT16 = 8
INT32 = 9
INT64 = 10
UINT = 11
UINT8 = 12
UINT16 = 13
UINT32 = 14
UINT64 = 15
FLOAT = 16
DOUBLE = 17
TIMEVAL = 18
TIME = 19
STATUS = 20
VALUE = 21
PROC = 22
APP = 23
INFO = 24
PDATA = 25
BYTE_OBJECT = 27
PERSIST = 30
POINTER = 31
SCOPE = 32
DATA_RANGE = 33
PROC_STATE = 37
PROC_INFO = 38
DATA_ARRAY = 39
PROC_RANK = 40
REGATTR = 48
PROC_NSPACE = 60

TYPE_NAMES: dict[int, str] = {
    UNDEF: "PMIX_UNDEF", BOOL: "PMIX_BOOL", BYTE: "PMIX_BYTE", STRING: "PMIX_STRING",
    SIZE: "PMIX_SIZE", PID: "PMIX_PID", INT: "PMIX_INT", INT8: "PMIX_INT8",
    INT16: "PMIX_INT16", INT32: "PMIX_INT32", INT64: "PMIX_INT64", UINT: "PMIX_UINT",
    UINT8: "PMIX_UINT8", UINT16: "PMIX_UINT16", UINT32: "PMIX_UINT32",
    UINT64: "PMIX_UINT64", FLOAT: "PMIX_FLOAT", DOUBLE: "PMIX_DOUBLE",
    TIMEVAL: "PMIX_TIMEVAL", TIME: "PMIX_TIME", STATUS: "PMIX_STATUS",
    PROC: "PMIX_PROC", INFO: "PMIX_INFO", BYTE_OBJECT: "PMIX_BYTE_OBJECT",
    PERSIST: "PMIX_PERSIST", POINTER: "PMIX_POINTER", SCOPE: "PMIX_SCOPE",
    DATA_RANGE: "PMIX_DATA_RANGE", PROC_STATE: "PMIX_PROC_STATE",
    DATA_ARRAY: "PMIX_DATA_ARRAY", PROC_RANK: "PMIX_PROC_RANK",
    PROC_NSPACE: "PMIX_PROC_NSPACE", PROC_INFO: "PMIX_PROC_INFO", REGATTR: "PMIX_REGATTR",
}


def type_name(t: int) -> str:
    return TYPE_NAMES.get(int(t), f"PMIX_TYPE({int(t)})")


# --------------------------------------------------------------------------
# Ranges and persistences (uint8).  The numbers are those of SPEC section 8;
# PMIx 4.2.2 has no PERSIST_NSPACE, pydvm's 5.

RANGE_UNDEF = 0
RANGE_RM = 1
RANGE_LOCAL = 2
RANGE_NAMESPACE = 3
RANGE_SESSION = 4
RANGE_GLOBAL = 5
RANGE_CUSTOM = 6
RANGE_PROC_LOCAL = 7
RANGE_INVALID = 255

PERSIST_INDEF = 0
PERSIST_FIRST_READ = 1
PERSIST_PROC = 2
PERSIST_APP = 3
PERSIST_SESSION = 4
PERSIST_NSPACE = 5      # pydvm's; not defined by PMIx 4.2.2
PERSIST_INVALID = 255

# --------------------------------------------------------------------------
# Ranks

RANK_UNDEF = 0xFFFFFFFF
RANK_WILDCARD = 0xFFFFFFFE
RANK_LOCAL_NODE = 0xFFFFFFFD
RANK_INVALID = 0xFFFFFFFC

# --------------------------------------------------------------------------
# Sizes

MAX_NSLEN = 255
MAX_KEYLEN = 511

# --------------------------------------------------------------------------
# Attribute keys used by the binding

ATTR_PREFIX = "pmix."

SERVER_TMPDIR = "pmix.srvr.tmpdir"
SYSTEM_TMPDIR = "pmix.sys.tmpdir"
SERVER_NSPACE = "pmix.srv.nspace"
SERVER_RANK = "pmix.srv.rank"
SERVER_SYSTEM_SUPPORT = "pmix.srvr.sys"
SERVER_TOOL_SUPPORT = "pmix.srvr.tool"
SERVER_SHARE_TOPOLOGY = "pmix.srvr.share"
HWLOC_SHMEM_FILE = "pmix.hwlocfile"
HWLOC_SHMEM_ADDR = "pmix.hwlocaddr"
HWLOC_SHMEM_SIZE = "pmix.hwlocsize"
HWLOC_XML_V2 = "pmix.hwlocxml2"

NODE_MAP = "pmix.nmap"
PROC_MAP = "pmix.pmap"
JOBID = "pmix.jobid"
NSPACE = "pmix.nspace"
JOB_SIZE = "pmix.job.size"
UNIV_SIZE = "pmix.univ.size"
MAX_PROCS = "pmix.max.size"
NUM_NODES = "pmix.num.nodes"
JOB_NUM_APPS = "pmix.job.napps"
SESSION_ID = "pmix.session.id"
NPROC_OFFSET = "pmix.offset"
LOCAL_PEERS = "pmix.lpeers"
LOCAL_SIZE = "pmix.local.size"
LOCALLDR = "pmix.lldr"
NODE_SIZE = "pmix.node.size"
NODE_LIST = "pmix.nlist"
TMPDIR = "pmix.tmpdir"
NSDIR = "pmix.nsdir"
PROC_DATA = "pmix.pdata"            # PMIX_PROC_INFO_ARRAY
APP_INFO_ARRAY = "pmix.app.arr"
NODE_INFO_ARRAY = "pmix.node.arr"
RANK = "pmix.rank"
GLOBAL_RANK = "pmix.grank"
APPNUM = "pmix.appnum"
APP_SIZE = "pmix.app.size"
APPLDR = "pmix.aldr"
APP_RANK = "pmix.apprank"
LOCAL_RANK = "pmix.lrank"
NODE_RANK = "pmix.nrank"
NODEID = "pmix.nodeid"
HOSTNAME = "pmix.hname"
CPUSET = "pmix.cpuset"            # a process's binding, as a CPU list ("0-1")
LOCALITY_STRING = "pmix.locstr"    # its location ("SK0:L30:...:NM0"), Open MPI 4.1's form
SPAWNED = "pmix.spawned"
PARENT_ID = "pmix.parent"
WDIR = "pmix.wdir"
APP_ARGV = "pmix.app.argv"
LOCAL_PROCS = "pmix.lprocs"
REINCARNATION = "pmix.reinc"
NODE_OVERSUBSCRIBED = "pmix.ndosub"

RANGE = "pmix.range"
PERSISTENCE = "pmix.persist"
WAIT = "pmix.wait"
TIMEOUT = "pmix.timeout"
USERID = "pmix.euid"
GRPID = "pmix.egid"
COLLECT_DATA = "pmix.collect"
ACCESS_USERIDS = "pmix.auids"
ACCESS_GRPIDS = "pmix.agids"

# events
EVENT_AFFECTED_PROC = "pmix.evproc"
EVENT_AFFECTED_PROCS = "pmix.evaffected"
EVENT_CUSTOM_RANGE = "pmix.evrange"
EVENT_NON_DEFAULT = "pmix.evnondef"
EVENT_DO_NOT_CACHE = "pmix.evnocache"
EVENT_TEXT_MESSAGE = "pmix.evtext"
EXIT_CODE = "pmix.exit.code"
JOB_TERM_STATUS = "pmix.job.term.status"
PROC_TERM_STATUS = "pmix.proc.term.status"
SERVER_INTERNAL_NOTIFY = "pmix.srvr.internal.notify"

# debuggers
DEBUG_STOP_IN_INIT = "pmix.dbg.init"
DEBUG_STOP_ON_EXEC = "pmix.dbg.exec"
DEBUG_TARGET = "pmix.dbg.tgt"
DEBUG_JOB = "pmix.dbg.job"     # deprecated (pmix_deprecated.h); examples/debugger.c sends it
DEBUGGER_DAEMONS = "pmix.debugger"
DEBUG_DAEMONS_PER_NODE = "pmix.dbg.dpnd"
DEBUG_DAEMONS_PER_PROC = "pmix.dbg.dpproc"
BREAKPOINT = "pmix.brkpnt"

# groups
GROUP_CONTEXT_ID = "pmix.grp.ctxid"
GROUP_ENDPT_DATA = "pmix.grp.endpt"
GROUP_ASSIGN_CONTEXT_ID = "pmix.grp.actxid"
GROUP_LOCAL_ONLY = "pmix.grp.lcl"

# info directive flags
INFO_REQD = 0x1
INFO_ARRAY_END = 0x2
