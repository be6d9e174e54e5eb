"""tierkv: Python client of the tierkv KV-cache daemon (tierkvd).

    import tierkv
    with tierkv.connect("/run/tierkv/tierkv.sock", namespace="default",
                        token_file="/var/lib/tierkv/tokens/default") as c:
        c.register_layout(tierkv.Layout.uniform(64, 78, [("kv", 656),
                                                         ("index_k", 132)]))
        pages = tierkv.page_hashes(token_ids, 64, namespace="default")
        hit = c.match(pages)              # leading stored pages, per-page tier
        c.put(pages, layer, "kv", rows)   # one row per segment, no copy
        c.get(pages, layer, "kv", out)    # straight into `out`

Engine adapters: tierkv.sglang (HiCacheStorage) and tierkv.vllm (a vLLM
KV connector); they import their engine only when used.
"""

from .client import (Client, Layout, MatchResult, Pool, ReadLease, Transfer,
                     as_pages, connect, page_hashes, root_page_hash)
from .errors import (AlreadyExistsError, BusyError, ClientClosedError,
                     CorruptionError, InternalError, InvalidArgumentError,
                     NotFoundError, PermissionDeniedError, ProtocolError,
                     ResourceExhaustedError, ShutdownError, TierkvError,
                     TierkvIOError, UnavailableError)

__version__ = "0.1.0"

__all__ = [
    "Client", "Layout", "MatchResult", "Pool", "ReadLease", "Transfer",
    "as_pages", "connect", "page_hashes", "root_page_hash", "TierkvError",
    "AlreadyExistsError", "BusyError", "ClientClosedError",
    "CorruptionError", "InternalError", "InvalidArgumentError",
    "NotFoundError", "PermissionDeniedError", "ProtocolError",
    "ResourceExhaustedError", "ShutdownError", "TierkvIOError",
    "UnavailableError",
]
