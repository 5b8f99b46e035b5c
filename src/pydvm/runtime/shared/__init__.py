"""What the rooms share: the low layers both sides of a DVM use.

Imported module by module (it is a toolbox, not a component): ``auth`` and
``credential`` (URIs, the DVM secret, handshakes, the direct-data
credential), ``door`` (listeners), ``peers`` (typed peer sessions, the one
builder of a process's identity), ``dataops`` (how a data request is applied
to a store, which store takes which request), ``storeguard`` and ``stats``
(the store lock of a multi-threaded node; what a store served), ``jobs``
(the pure records of jobs, apps, processes and sessions; rank mapping),
``jobproc`` (starting, signalling and ending processes), ``guard`` (no
orphans), ``sockdir`` (private socket directories), ``registry`` (one DVM per
id), ``logs``.  Nothing here imports another room.
"""
