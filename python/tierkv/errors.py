"""Typed errors: one exception class per tierkv status code.

Every failure the daemon or the client library reports surfaces as a
subclass of TierkvError carrying the status name, its number and the
library's own message ("<code>: <message>"). Classes also derive from the
closest builtin so generic handlers work (InvalidArgumentError is a
ValueError, UnavailableError a ConnectionError, and so on).
"""

from __future__ import annotations

from typing import Optional

import numpy as np


class TierkvError(Exception):
    """A tierkv call failed.

    Attributes:
      code: the status name, e.g. "not_found".
      status: the status number (tierkv::StatusCode / tierkv_status).
      statuses: for batch calls, one status number per item (numpy uint8),
        else None.
      index: for batch calls, the first failing item, else None.
    """

    code = "unknown"
    status = -1

    def __init__(self, message: str, statuses: Optional[np.ndarray] = None,
                 index: Optional[int] = None):
        super().__init__(message)
        self.message = message
        self.statuses = statuses
        self.index = index


class NotFoundError(TierkvError, LookupError):
    code, status = "not_found", 1


class AlreadyExistsError(TierkvError):
    code, status = "already_exists", 2


class InvalidArgumentError(TierkvError, ValueError):
    code, status = "invalid_argument", 3


class PermissionDeniedError(TierkvError, PermissionError):
    code, status = "permission_denied", 4


class ResourceExhaustedError(TierkvError, MemoryError):
    code, status = "resource_exhausted", 5


class BusyError(TierkvError):
    code, status = "busy", 6


class TierkvIOError(TierkvError, OSError):
    code, status = "io_error", 7


class CorruptionError(TierkvError):
    code, status = "corruption", 8


class ShutdownError(TierkvError):
    code, status = "shutdown", 9


class ProtocolError(TierkvError):
    code, status = "protocol_error", 10


class InternalError(TierkvError):
    code, status = "internal", 11


class UnavailableError(TierkvError, ConnectionError):
    code, status = "unavailable", 12


class ClientClosedError(TierkvError, ValueError):
    """A method was called on a Client (or handle) after close()."""

    code = "closed"


_BY_STATUS = {cls.status: cls for cls in (
    NotFoundError, AlreadyExistsError, InvalidArgumentError,
    PermissionDeniedError, ResourceExhaustedError, BusyError, TierkvIOError,
    CorruptionError, ShutdownError, ProtocolError, InternalError,
    UnavailableError)}


def error_for(status: int, message: str,
              statuses: Optional[np.ndarray] = None,
              index: Optional[int] = None) -> TierkvError:
    """The exception for a non-zero status number."""
    cls = _BY_STATUS.get(status, InternalError)
    return cls(message, statuses=statuses, index=index)
