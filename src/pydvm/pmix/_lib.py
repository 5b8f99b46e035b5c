"""Loading libpmix.so.2 with ctypes, its version check, and the C layouts.

Nothing is compiled: the structs below mirror ``pmix_common.h`` /
``pmix_server.h`` of the library versions listed in :data:`VERIFIED`, where
they were checked field by field against the C compiler's ``sizeof`` and
``offsetof`` (x86_64).  Any other version is refused before a single struct
crosses the boundary: a layout mismatch would corrupt memory silently.

Adding a version: check the layouts against that version's headers (the
sizes asserted in :func:`_check_sizes` and the ``pmix_server_module_t`` slot
order), then add an entry to :data:`VERIFIED`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import threading
from dataclasses import dataclass

from . import constants as C


class PmixUnavailable(RuntimeError):
    """libpmix cannot be used: not installed, or a version we have not verified."""


# --------------------------------------------------------------------------
# Version check


@dataclass(frozen=True)
class VerifiedLayout:
    """What was checked for one library series."""

    series: tuple[int, int]          # (major, minor)
    min_patch: int                   # lowest patch release checked
    module_slots: int                # function pointers in pmix_server_module_t
    note: str


VERIFIED: dict[tuple[int, int], VerifiedLayout] = {
    (4, 2): VerifiedLayout((4, 2), 0, 28,
                           "OpenPMIx 4.2.x (checked on Debian 12's 4.2.2): "
                           "pmix_server_module_t 4.0.0 layout, 28 slots"),
}

_VERSION_RE = re.compile(r"OpenPMIx\s+(\d+)\.(\d+)\.(\d+)")


def parse_version(version_string: str) -> tuple[int, int, int]:
    """``'OpenPMIx 4.2.2rc2 (PMIx Standard: 4.2, ...)'`` -> ``(4, 2, 2)``."""
    m = _VERSION_RE.search(version_string or "")
    if not m:
        raise PmixUnavailable(
            f"cannot parse the libpmix version string {version_string!r} "
            "(expected 'OpenPMIx X.Y.Z ...')")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def check_version(version_string: str) -> VerifiedLayout:
    """Return the verified layout for this version, or raise :class:`PmixUnavailable`.

    Only versions whose struct layouts were verified are accepted (see
    :data:`VERIFIED`); the message names the version found and those supported.
    """
    major, minor, patch = parse_version(version_string)
    lay = VERIFIED.get((major, minor))
    if lay is None or patch < lay.min_patch:
        supported = ", ".join(f"{a}.{b}.x" for a, b in sorted(VERIFIED))
        raise PmixUnavailable(
            f"libpmix {major}.{minor}.{patch} is not supported by pydvm.pmix "
            f"(struct layouts verified only for {supported}); "
            "install a supported libpmix or set PYDVM_LIBPMIX to one")
    return lay


# --------------------------------------------------------------------------
# C layouts (PMIx 4.2)

pmix_status_t = ctypes.c_int
pmix_rank_t = ctypes.c_uint32
pmix_data_type_t = ctypes.c_uint16
NSPACE_T = ctypes.c_char * (C.MAX_NSLEN + 1)
KEY_T = ctypes.c_char * (C.MAX_KEYLEN + 1)


class pmix_proc_t(ctypes.Structure):
    _fields_ = [("nspace", NSPACE_T), ("rank", pmix_rank_t)]


class pmix_byte_object_t(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_void_p), ("size", ctypes.c_size_t)]


class pmix_data_array_t(ctypes.Structure):
    _fields_ = [("type", pmix_data_type_t), ("size", ctypes.c_size_t),
                ("array", ctypes.c_void_p)]


class _value_data(ctypes.Union):
    _fields_ = [
        ("flag", ctypes.c_bool), ("byte", ctypes.c_uint8), ("string", ctypes.c_void_p),
        ("size", ctypes.c_size_t), ("pid", ctypes.c_int32), ("integer", ctypes.c_int),
        ("int8", ctypes.c_int8), ("int16", ctypes.c_int16), ("int32", ctypes.c_int32),
        ("int64", ctypes.c_int64), ("uint", ctypes.c_uint), ("uint8", ctypes.c_uint8),
        ("uint16", ctypes.c_uint16), ("uint32", ctypes.c_uint32), ("uint64", ctypes.c_uint64),
        ("fval", ctypes.c_float), ("dval", ctypes.c_double),
        ("tv", ctypes.c_int64 * 2), ("time", ctypes.c_int64),
        ("status", pmix_status_t), ("rank", pmix_rank_t),
        ("proc", ctypes.c_void_p), ("bo", pmix_byte_object_t),
        ("persist", ctypes.c_uint8), ("scope", ctypes.c_uint8), ("range", ctypes.c_uint8),
        ("state", ctypes.c_uint8), ("darray", ctypes.c_void_p), ("ptr", ctypes.c_void_p),
        ("_envar", ctypes.c_byte * 24),           # pmix_envar_t: the largest member
    ]


class pmix_value_t(ctypes.Structure):
    _fields_ = [("type", pmix_data_type_t), ("data", _value_data)]


class pmix_info_t(ctypes.Structure):
    _fields_ = [("key", KEY_T), ("flags", ctypes.c_uint32), ("value", pmix_value_t)]


class pmix_pdata_t(ctypes.Structure):
    _fields_ = [("proc", pmix_proc_t), ("key", KEY_T), ("value", pmix_value_t)]


class pmix_app_t(ctypes.Structure):
    _fields_ = [("cmd", ctypes.c_void_p), ("argv", ctypes.c_void_p),
                ("env", ctypes.c_void_p), ("cwd", ctypes.c_void_p),
                ("maxprocs", ctypes.c_int), ("info", ctypes.c_void_p),
                ("ninfo", ctypes.c_size_t)]


class pmix_query_t(ctypes.Structure):
    _fields_ = [("keys", ctypes.c_void_p), ("qualifiers", ctypes.c_void_p),
                ("nqual", ctypes.c_size_t)]


class pmix_proc_info_t(ctypes.Structure):
    _fields_ = [("proc", pmix_proc_t), ("hostname", ctypes.c_void_p),
                ("executable_name", ctypes.c_void_p), ("pid", ctypes.c_int32),
                ("exit_code", ctypes.c_int), ("state", ctypes.c_uint8)]


class pmix_regattr_t(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("string", KEY_T), ("type", pmix_data_type_t),
                ("description", ctypes.c_void_p)]


class regattr_input_t(ctypes.Structure):
    """libpmix's own dictionary entry (``pmix_regattr_input_t``, 4.2 internal)."""
    _fields_ = [("index", ctypes.c_uint32), ("name", ctypes.c_void_p),
                ("string", ctypes.c_void_p), ("type", pmix_data_type_t),
                ("description", ctypes.c_void_p)]


def _check_sizes() -> None:
    # The figures gcc reports for PMIx 4.2.2 on x86_64 (sizeof / offsetof).
    expect = {pmix_proc_t: 260, pmix_value_t: 32, pmix_info_t: 552, pmix_pdata_t: 808,
              pmix_app_t: 56, pmix_data_array_t: 24, pmix_byte_object_t: 16,
              pmix_query_t: 24, pmix_proc_info_t: 296, pmix_regattr_t: 536}
    for cls, size in expect.items():
        got = ctypes.sizeof(cls)
        if got != size:
            raise PmixUnavailable(
                f"{cls.__name__} is {got} bytes here, not the verified {size}: "
                "this platform's ABI is not supported by pydvm.pmix")
    if (pmix_info_t.value.offset, pmix_pdata_t.key.offset, pmix_pdata_t.value.offset,
            pmix_value_t.data.offset) != (520, 260, 776, 8):
        raise PmixUnavailable("pmix struct offsets differ from the verified layout")


# --------------------------------------------------------------------------
# Callback prototypes (pmix_server.h / pmix_common.h)

op_cbfunc_t = ctypes.CFUNCTYPE(None, pmix_status_t, ctypes.c_void_p)
release_cbfunc_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
modex_cbfunc_t = ctypes.CFUNCTYPE(None, pmix_status_t, ctypes.c_void_p, ctypes.c_size_t,
                                  ctypes.c_void_p, release_cbfunc_t, ctypes.c_void_p)
lookup_cbfunc_t = ctypes.CFUNCTYPE(None, pmix_status_t, ctypes.c_void_p, ctypes.c_size_t,
                                   ctypes.c_void_p)
spawn_cbfunc_t = ctypes.CFUNCTYPE(None, pmix_status_t, ctypes.c_char_p, ctypes.c_void_p)
dmodex_response_fn_t = ctypes.CFUNCTYPE(None, pmix_status_t, ctypes.c_void_p,
                                        ctypes.c_size_t, ctypes.c_void_p)
info_cbfunc_t = ctypes.CFUNCTYPE(None, pmix_status_t, ctypes.c_void_p, ctypes.c_size_t,
                                 ctypes.c_void_p, release_cbfunc_t, ctypes.c_void_p)

_P = ctypes.c_void_p
_S = ctypes.c_size_t
# Upcall prototypes, by slot index of pmix_server_module_t (4.0.0 layout).
UPCALL_TYPES: dict[str, tuple[int, object]] = {
    # name: (slot, prototype)
    "client_connected": (0, ctypes.CFUNCTYPE(pmix_status_t, _P, _P, _P, _P)),
    "client_finalized": (1, ctypes.CFUNCTYPE(pmix_status_t, _P, _P, _P, _P)),
    "abort": (2, ctypes.CFUNCTYPE(pmix_status_t, _P, _P, ctypes.c_int, ctypes.c_char_p,
                                  _P, _S, _P, _P)),
    "fence_nb": (3, ctypes.CFUNCTYPE(pmix_status_t, _P, _S, _P, _S, _P, _S, _P, _P)),
    "direct_modex": (4, ctypes.CFUNCTYPE(pmix_status_t, _P, _P, _S, _P, _P)),
    "publish": (5, ctypes.CFUNCTYPE(pmix_status_t, _P, _P, _S, _P, _P)),
    "lookup": (6, ctypes.CFUNCTYPE(pmix_status_t, _P, _P, _P, _S, _P, _P)),
    "unpublish": (7, ctypes.CFUNCTYPE(pmix_status_t, _P, _P, _P, _S, _P, _P)),
    "spawn": (8, ctypes.CFUNCTYPE(pmix_status_t, _P, _P, _S, _P, _S, _P, _P)),
    "connect": (9, ctypes.CFUNCTYPE(pmix_status_t, _P, _S, _P, _S, _P, _P)),
    "disconnect": (10, ctypes.CFUNCTYPE(pmix_status_t, _P, _S, _P, _S, _P, _P)),
    "register_events": (11, ctypes.CFUNCTYPE(pmix_status_t, _P, _S, _P, _S, _P, _P)),
    "deregister_events": (12, ctypes.CFUNCTYPE(pmix_status_t, _P, _S, _P, _P)),
    "notify_event": (14, ctypes.CFUNCTYPE(pmix_status_t, pmix_status_t, _P, ctypes.c_uint8,
                                          _P, _S, _P, _P)),
    "query": (15, ctypes.CFUNCTYPE(pmix_status_t, _P, _P, _S, _P, _P)),
    # void (*)(pmix_info_t *, size_t, pmix_tool_connection_cbfunc_t, void *): pmix/tools.py
    "tool_connected": (16, ctypes.CFUNCTYPE(None, _P, _S, _P, _P)),
    "group": (25, ctypes.CFUNCTYPE(pmix_status_t, ctypes.c_int, ctypes.c_char_p, _P, _S, _P,
                                   _S, _P, _P)),
    "client_connected2": (27, ctypes.CFUNCTYPE(pmix_status_t, _P, _P, _P, _S, _P, _P)),
    # PMIx_Allocation_request (client, directive, data, ndata, cbfunc, cbdata) and
    # PMIx_Job_control (requestor, targets, ntargets, directives, ndirs, cbfunc, cbdata)
    "allocate": (18, ctypes.CFUNCTYPE(pmix_status_t, _P, ctypes.c_uint8, _P, _S, _P, _P)),
    "job_control": (19, ctypes.CFUNCTYPE(pmix_status_t, _P, _P, _S, _P, _S, _P, _P)),
}
MODULE_SLOTS = 28


class pmix_server_module_t(ctypes.Structure):
    _fields_ = [(f"slot{i}", ctypes.c_void_p) for i in range(MODULE_SLOTS)]


# --------------------------------------------------------------------------
# Loading

ENV_OVERRIDE = "PYDVM_LIBPMIX"
_lock = threading.Lock()
_loaded: "Lib | None" = None
_failure: str | None = None


def _candidates() -> list[str]:
    env = os.environ.get(ENV_OVERRIDE)
    if env:
        return [env]
    names = ["libpmix.so.2"]
    found = ctypes.util.find_library("pmix")
    if found and found not in names:
        names.append(found)
    return names


def _mapped_path(fragment: str) -> str | None:
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and fragment in os.path.basename(parts[5].strip()):
                    return parts[5].strip()
    except OSError:
        pass
    return None


class Lib:
    """The loaded library: its functions with their prototypes."""

    def __init__(self, cdll: ctypes.CDLL, path: str, version: str, layout: VerifiedLayout):
        self.cdll = cdll
        self.path = path
        self.version = version
        self.layout = layout
        f = cdll
        P, S = ctypes.c_void_p, ctypes.c_size_t
        self.server_init = _proto(f.PMIx_server_init, pmix_status_t, [P, P, S])
        self.server_finalize = _proto(f.PMIx_server_finalize, pmix_status_t, [])
        self.register_nspace = _proto(f.PMIx_server_register_nspace, pmix_status_t,
                                      [ctypes.c_char_p, ctypes.c_int, P, S, P, P])
        self.deregister_nspace = _proto(f.PMIx_server_deregister_nspace, None,
                                        [ctypes.c_char_p, P, P])
        self.register_client = _proto(f.PMIx_server_register_client, pmix_status_t,
                                      [P, ctypes.c_uint32, ctypes.c_uint32, P, P, P])
        self.deregister_client = _proto(f.PMIx_server_deregister_client, None, [P, P, P])
        self.setup_fork = _proto(f.PMIx_server_setup_fork, pmix_status_t,
                                 [P, ctypes.POINTER(ctypes.POINTER(ctypes.c_char_p))])
        self.dmodex_request = _proto(f.PMIx_server_dmodex_request, pmix_status_t,
                                     [P, dmodex_response_fn_t, P])
        self.generate_regex = _proto(f.PMIx_generate_regex, pmix_status_t,
                                     [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)])
        self.generate_ppn = _proto(f.PMIx_generate_ppn, pmix_status_t,
                                   [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)])
        self.error_string = _proto(f.PMIx_Error_string, ctypes.c_char_p, [pmix_status_t])
        self.notify_event = _proto(f.PMIx_Notify_event, pmix_status_t,
                                   [pmix_status_t, P, ctypes.c_uint8, P, S, op_cbfunc_t, P])
        self.register_attributes = _proto(f.PMIx_Register_attributes, pmix_status_t,
                                          [ctypes.c_char_p, P])
        self.query_info_nb = _proto(f.PMIx_Query_info_nb, pmix_status_t, [P, S, P, P])
        self.attribute_string = _proto(f.PMIx_Get_attribute_string, ctypes.c_char_p,
                                       [ctypes.c_char_p])
        # libpmix's dictionary of attributes (exported, not part of the API)
        lookup = getattr(f, "pmix_attributes_lookup_term", None)
        self.lookup_term = _proto(lookup, P, [ctypes.c_char_p]) if lookup else None
        self.libc = ctypes.CDLL(None)
        self.free = _proto(self.libc.free, None, [P])
        self.malloc = _proto(self.libc.malloc, P, [S])


def _proto(fn, restype, argtypes):
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


def load() -> Lib:
    """Load and check libpmix once per process; raise :class:`PmixUnavailable` if unusable."""
    global _loaded, _failure
    with _lock:
        if _loaded is not None:
            return _loaded
        if _failure is not None:
            raise PmixUnavailable(_failure)
        try:
            _loaded = _load()
            return _loaded
        except PmixUnavailable as e:
            _failure = str(e)
            raise


def _load() -> Lib:
    _check_sizes()
    errors = []
    cdll = None
    for name in _candidates():
        try:
            # RTLD_GLOBAL: libpmix's own plugins resolve their symbols in it.
            cdll = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
            break
        except OSError as e:
            errors.append(f"{name}: {e}")
    if cdll is None:
        raise PmixUnavailable("libpmix.so.2 not found (" + "; ".join(errors) +
                              "); on Debian/Ubuntu: apt-get install libpmix2")
    path = (_mapped_path("libpmix.so") or getattr(cdll, "_name", "") or "libpmix.so.2")
    try:
        gv = cdll.PMIx_Get_version
    except AttributeError:
        raise PmixUnavailable(f"{path} has no PMIx_Get_version: not a PMIx library")
    gv.restype = ctypes.c_char_p
    gv.argtypes = []
    version = (gv() or b"").decode("utf-8", "replace")
    layout = check_version(version)
    return Lib(cdll, path, version, layout)


def available() -> tuple[bool, str, str | None]:
    """``(True, version string, library path)`` or ``(False, reason, path or None)``.

    Loads libpmix if it was not loaded yet (nothing else: no server starts).
    """
    try:
        lib = load()
        return True, lib.version, lib.path
    except PmixUnavailable as e:
        return False, str(e), _mapped_path("libpmix.so")
