"""The process's descriptor limit, and the connections it leaves room for.

Every open connection holds a descriptor; so do the listening sockets, the gRPC front's
connections, the interpreters' eventfds, the front loops' channels and the files models
open. A server that accepts until `accept` fails with EMFILE has no descriptor left to
answer with, or to load a model. So the server raises its soft limit to the hard one at
start (as Go's runtime and nginx's `worker_rlimit_nofile` do) and, unless told otherwise
(`--max-connections`), serves at most what that limit leaves after a reserve for the rest.
"""

from __future__ import annotations

import resource

RESERVE_MIN = 128  # descriptors kept for everything but HTTP connections, at the least
RESERVE_SHARE = 8  # ... and one in this many of the limit


def raise_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit where it is lower; the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # a hard limit the kernel caps lower (nr_open): keep the soft one
            pass
    return soft


def connections(limit: int | None = None) -> int:
    """Connections the descriptor limit (`limit`, else the soft RLIMIT_NOFILE) leaves room for:
    all but max(RESERVE_MIN, limit / RESERVE_SHARE), at least 1. 0 (no limit) when the limit
    is infinite."""
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if limit == resource.RLIM_INFINITY:
        return 0
    return max(1, limit - max(RESERVE_MIN, limit // RESERVE_SHARE))
