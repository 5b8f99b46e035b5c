"""A native pydvm client driven by its arguments (the counterpart of pmix_ops.c).

    pub:KEY:KIND:VALUE     publish one value; KIND str bytes(hex) int float bool,
                           or a PMIx type code (pydvm.Typed with an int value)
    pubacc:KEY:UID         publish KEY=x readable only by UID
    look:K1,K2             lookup; prints FOUND key=K type=PMIX_... value=REPR from=NS:RANK
    lookw:K1,K2:SECONDS    waiting lookup of all keys
    hold:SECONDS           stay alive
"""
import sys
import time

from pydvm import Client, PMIxError, Typed

CONV = {"str": str, "bytes": bytes.fromhex, "int": int, "float": float,
        "bool": lambda s: s == "1"}

with Client() as c:
    for op in sys.argv[1:]:
        name, _, rest = op.partition(":")
        try:
            if name == "pub":
                key, kind, value = rest.split(":", 2)
                v = CONV[kind](value) if kind in CONV else Typed(int(value), int(kind))
                c.publish({key: v})
                print(f"PUBLISH key={key} status=0", flush=True)
            elif name == "pubacc":
                key, uid = rest.split(":")
                c.publish({key: "x"}, access_uids=[int(uid)])
                print(f"PUBLISH key={key} status=0", flush=True)
            elif name in ("look", "lookw"):
                keys, _, secs = rest.partition(":")
                r = c.lookup(keys.split(","), wait=name == "lookw",
                             timeout=float(secs) if secs else None)
                print(f"LOOKUP status={int(r.status)}", flush=True)
                for k, f in r.found.items():
                    print(f"FOUND key={k} type={f.pmix_type} value={f.value!r} "
                          f"from={f.nspace}:{f.rank}", flush=True)
            elif name == "hold":
                time.sleep(float(rest))
        except PMIxError as e:
            print(f"{name.upper()} status={int(e.status)}", flush=True)
