"""Errors of the dfa package: every failure of the C++ client library arrives as a DfaError.

* ``DfaError``: ``code`` is the status code's name ("UNAVAILABLE", "INVALID_ARGUMENT",
  "DEADLINE_EXCEEDED", ...), ``details`` the message, which names the argument or field
  (``spec.q_heads: must be a multiple of kv_heads (4), got 6``) or the unreachable address and
  the call (``CreateSession: failed to connect to all addresses ...``). A failed job carries the
  job's own code and reason (UNAVAILABLE when a worker was lost).
* ``InvalidArgumentError`` (code INVALID_ARGUMENT) is also a ``ValueError``: bad inputs caught
  before anything is sent, and the service's refusals of a spec or a chunk.
* ``DeadlineExceededError`` is also a ``TimeoutError``.
"""


class DfaError(Exception):
    def __init__(self, code, details, what=""):
        self.code = code
        self.details = details
        self.what = what
        super().__init__("%s%s: %s" % (what + ": " if what else "", code, details))


class InvalidArgumentError(DfaError, ValueError):
    """INVALID_ARGUMENT: the message names the argument or field first."""


class DeadlineExceededError(DfaError, TimeoutError):
    """DEADLINE_EXCEEDED: a call or a job ran past its deadline."""


_BY_CODE = {"INVALID_ARGUMENT": InvalidArgumentError, "DEADLINE_EXCEEDED": DeadlineExceededError}


def from_status(code, name, message):
    """The exception for an absl::Status (the extension raises what this returns)."""
    del code  # the name says it
    return _BY_CODE.get(name, DfaError)(name, message)
