"""Errors of the dfa package.

* ValueError: a bad input caught on the client, before anything is sent; the message names the
  field (``q_heads: 6 is not a multiple of kv_heads = 4``).
* DfaError: the service answered with a gRPC status (``code`` is a grpc.StatusCode, ``details``
  the server's message naming the field), or a job ended in JOB_FAILED / JOB_CANCELLED.
"""

import grpc

_BY_VALUE = {c.value[0]: c for c in grpc.StatusCode}


def status_code(value):
    """grpc.StatusCode for a numeric code (Job.error_code), UNKNOWN when out of range."""
    return _BY_VALUE.get(int(value), grpc.StatusCode.UNKNOWN)


class DfaError(Exception):
    def __init__(self, code, details, what=""):
        self.code = code
        self.details = details
        self.what = what
        super().__init__("%s%s: %s" % (what + ": " if what else "", code.name, details))

    @classmethod
    def from_rpc(cls, err, what):
        code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
        details = err.details() if hasattr(err, "details") else str(err)
        return cls(code, details or "", what)


class JobFailedError(DfaError):
    """A job reached JOB_FAILED or JOB_CANCELLED; ``job`` is the final Job message."""

    def __init__(self, job, code, details, what):
        self.job = job
        super().__init__(code, details, what)
