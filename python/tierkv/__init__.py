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
KV connector); they import their engine only when used. tierkv.weights
stores model weights in a weights namespace (TensorBackuper: slime's
weight switching backed by the daemon's tiers).
"""

from .client import (Client, Layout, MatchResult, Pool, ReadLease, Transfer,
                     as_pages, connect, page_hashes, root_page_hash)
from .errors import (AlreadyExistsError, BusyError, ClientClosedError,
                     CorruptionError, InternalError, InvalidArgumentError,
                     NotFoundError, PermissionDeniedError, ProtocolError,
                     ResourceExhaustedError, ShutdownError, TierkvError,
                     TierkvIOError, UnavailableError)

__version__ = "0.1.0"

# This package is distributed as `tierkvd-client`. An unrelated project owns
# the PyPI name `tierkv` and installs a top-level package of the same import
# name; pip does not notice two distributions writing the same files, so one
# overwrites the other's. Say so rather than fail later in a strange way.
DISTRIBUTION = "tierkvd-client"


def _warn_if_shadowed() -> None:
    import warnings
    from importlib import metadata
    try:
        other = metadata.distribution("tierkv")
    except metadata.PackageNotFoundError:
        return
    warnings.warn(
        f"the unrelated PyPI package 'tierkv' {other.version} is installed in "
        f"this environment and shares the import name 'tierkv' with "
        f"{DISTRIBUTION}; their files overwrite each other. Run "
        f"`pip uninstall tierkv` and reinstall {DISTRIBUTION}.", stacklevel=3)


_warn_if_shadowed()

__all__ = [
    "Client", "Layout", "MatchResult", "Pool", "ReadLease", "Transfer",
    "as_pages", "connect", "page_hashes", "root_page_hash", "TierkvError",
    "AlreadyExistsError", "BusyError", "ClientClosedError",
    "CorruptionError", "InternalError", "InvalidArgumentError",
    "NotFoundError", "PermissionDeniedError", "ProtocolError",
    "ResourceExhaustedError", "ShutdownError", "TierkvIOError",
    "UnavailableError",
]
