"""The exceptions of the binding and the error codes they carry.

Every failure of a C call raises DquantError (or its subclass ClientError for libdquant-client)
with .code, the negative dq_error value the library returned, .name, the code's name without its
prefix ("NOT_FOUND", "NONFINITE", ...), and a message. ErrorCode names the codes of
lib/include/dquant/error.h (DQ_ERRNO_MAP), whose values travel on the wire and never change."""

from __future__ import annotations

import enum
from typing import Optional


class ErrorCode(enum.IntEnum):
    """dq_error (lib/include/dquant/error.h): 0 and the negative codes every library returns."""

    OK = 0
    INVALID_ARGUMENT = -1
    NOMEM = -2
    NONFINITE = -3
    RANGE = -4
    SHAPE = -5
    DTYPE = -6
    PROFILE = -7
    CONTAINER_TOO_SMALL = -8
    CORRUPT = -9
    TRUNCATED = -10
    VERSION = -11
    OUT_OF_BOUNDS = -12
    NOT_FOUND = -13
    EXISTS = -14
    RESOURCE_EXHAUSTED = -15
    UNAUTHENTICATED = -16
    PERMISSION = -17
    PROTOCOL = -18
    TOO_LARGE = -19
    UNSUPPORTED = -20
    IO = -21
    TIMEOUT = -22
    CONNECTION = -23
    BUSY = -24
    ORDER = -25
    SHUTTING_DOWN = -26
    INTERNAL = -27


def error_name(code: int) -> str:
    """The name of a code as the C libraries print it ("UNKNOWN" for a code this binding does not know)."""
    try:
        return ErrorCode(code).name
    except ValueError:
        return "UNKNOWN"


class DquantError(RuntimeError):
    """A failed call into libdquant or libdquant-client.

    Attributes: code (int, the negative dq_error value), name (str, e.g. "NOT_FOUND"), message
    (str, what the library said), what (str, the operation that failed). str(e) is
    "what: NAME: message"."""

    code: int
    name: str
    message: str
    what: str

    def __init__(self, code: int, what: str = "", message: str = "", name: Optional[str] = None) -> None:
        self.code = int(code)
        self.name = name or error_name(self.code)
        self.message = message
        self.what = what
        super().__init__(f"{what + ': ' if what else ''}{self.name}{': ' + message if message else ''}")

    def __reduce__(self):  # picklable across processes (multiprocessing) with its fields
        return (type(self), (self.code, self.what, self.message, self.name))


class ClientError(DquantError):
    """A failed call of the daemon client (libdquant-client): a server's error reply, or a local
    failure (CONNECTION, TIMEOUT, PROTOCOL, ...). The message is the handle's dqc_last_error()."""


class UnsupportedError(DquantError, NotImplementedError):
    """The loaded C library lacks a function this call needs (an older libdquant-client). Its code
    is ErrorCode.UNSUPPORTED."""

    def __init__(self, what: str, message: str = "") -> None:
        super().__init__(ErrorCode.UNSUPPORTED, what, message)

