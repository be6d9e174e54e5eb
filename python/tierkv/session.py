"""A tierkv connection that survives the daemon: engines keep serving while
tierkvd restarts.

An engine adapter cannot treat a lost daemon as fatal: it computes instead
of loading and skips its saves until tierkvd is back. Session holds what it
needs to connect (socket, namespace, token) and what must be redone on a
fresh connection (the namespace layout, since a restarted daemon may not
know it yet), hands out a connected Client, and drops it when a call fails
in a way that means the connection is gone. Reconnection is lazy (on the
next call) and throttled (at most one attempt per `retry_s`), so a dead
daemon costs an engine one failed connect per interval, not one per call.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional, TypeVar

import numpy as np

from .client import Client, Layout, connect
from .errors import (ClientClosedError, ProtocolError, ShutdownError,
                     TierkvError, TierkvIOError, UnavailableError)

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Errors after which the connection is not to be used again. Everything
# else (not_found, invalid_argument, ...) is an answer from a live daemon.
_CONNECTION_ERRORS = (UnavailableError, ShutdownError, ProtocolError,
                      ClientClosedError, ConnectionError, OSError)


# Per-item statuses that mean the same: a batch call to a daemon that went
# away can fail item by item rather than as a whole. io_error is ambiguous
# (a failed NVMe read on a live daemon, or a broken socket), so it is
# settled by a ping.
_CONNECTION_STATUSES = np.array([UnavailableError.status, ShutdownError.status,
                                 ProtocolError.status], dtype=np.uint8)


def is_connection_error(e: BaseException) -> bool:
    return isinstance(e, _CONNECTION_ERRORS)


def raise_if_disconnected(client: Client, statuses: np.ndarray) -> np.ndarray:
    """Returns per-item `statuses`, or raises UnavailableError when they say
    the connection is gone (Session.call then drops it)."""
    lost = np.isin(statuses, _CONNECTION_STATUSES).any()
    if not lost and (statuses == TierkvIOError.status).any():
        try:
            client.ping()
        except TierkvError:
            lost = True
    if lost:
        raise UnavailableError(
            f"tierkvd went away during a batch of {len(statuses)} items")
    return statuses


class Session:
    """Thread-safe. `call(fn)` runs fn(client) on a connected client and
    returns its result; a connection-class failure drops the client (the
    next call reconnects) and is re-raised as UnavailableError, so callers
    handle one exception type for "tierkvd is not there"."""

    def __init__(self, socket: str, *, namespace: str,
                 token: Optional[str] = None,
                 token_file: Optional[str] = None, timeout: float = 10.0,
                 retry_s: float = 1.0, connect_now: bool = True):
        self.socket = socket
        self.namespace = namespace
        self._token = token
        self._token_file = token_file
        self._timeout = timeout
        self._retry_s = retry_s
        self._mu = threading.Lock()
        self._client: Optional[Client] = None
        self._layout: Optional[Layout] = None
        self._next_attempt = 0.0
        self._closed = False
        self._connected_once = False
        if connect_now:
            # The first connection's errors (no socket, bad token) are
            # configuration errors: the engine should fail at start.
            with self._mu:
                self._connect_locked()

    def _connect_locked(self) -> Client:
        client = connect(self.socket, namespace=self.namespace,
                         token=self._token, token_file=self._token_file,
                         timeout=self._timeout)
        try:
            if self._layout is not None:
                client.register_layout(self._layout)
        except BaseException:
            client.close()
            raise
        if self._connected_once:
            logger.info("tierkv: reconnected to %s (namespace %s)",
                        self.socket, self.namespace)
        self._connected_once = True
        self._client = client
        return client

    def client(self) -> Client:
        """A connected client; raises UnavailableError while tierkvd is
        unreachable (without retrying more than once per retry_s)."""
        with self._mu:
            if self._closed:
                raise ClientClosedError("tierkv session is closed")
            if self._client is not None:
                return self._client
            now = time.monotonic()
            if now < self._next_attempt:
                raise UnavailableError(
                    f"tierkvd at {self.socket} unreachable (retrying every "
                    f"{self._retry_s:g} s)")
            self._next_attempt = now + self._retry_s
            try:
                return self._connect_locked()
            except TierkvError as e:
                if is_connection_error(e):
                    raise UnavailableError(str(e)) from e
                raise
            except OSError as e:  # e.g. the token file is gone
                raise UnavailableError(str(e)) from e

    def register_layout(self, layout: Layout) -> None:
        """Registers now and again on every later connection. A layout the
        daemon refuses (another one is registered) is not kept."""
        try:
            self.call(lambda c: c.register_layout(layout))
        except UnavailableError:
            with self._mu:
                self._layout = layout  # registered when tierkvd is back
            raise
        with self._mu:
            self._layout = layout

    def call(self, fn: Callable[[Client], T]) -> T:
        client = self.client()
        try:
            return fn(client)
        except BaseException as e:
            if is_connection_error(e):
                self._drop(client)
                if isinstance(e, UnavailableError):
                    raise
                raise UnavailableError(f"tierkv: {e}") from e
            raise

    def _drop(self, client: Client) -> None:
        with self._mu:
            if self._client is client:
                self._client = None
                logger.warning("tierkv: lost tierkvd at %s; computing "
                               "instead until it is back", self.socket)
        try:
            client.close()
        except TierkvError:
            pass

    def close(self) -> None:
        with self._mu:
            self._closed = True
            client, self._client = self._client, None
        if client is not None:
            client.close()
