"""The runtime's exception tree and its one mapping to HTTP status codes.

=========================  ======  ==============================================
exception                  status  when
=========================  ======  ==============================================
``InvalidRequest``         400     malformed JSON/binary body, bad parameters
``InvalidInput``           400     wrong tensor name, shape or datatype
``ModelNotFound``          404     the model is not in the configuration
``PayloadTooLarge``        413     body larger than ``maxRequestBytes``
``Unavailable``            503     server or model not ready
``Overloaded``             503     queue full or queue timeout (with Retry-After)
``BackendError``           500     the backend failed to run a batch
``EngineLoadError``        500     fetch, checksum, compatibility or deserialize failure
``InjectedFault``          500     fault injection (``faults.errorRate``)
=========================  ======  ==============================================
"""

from __future__ import annotations


class ServingError(Exception):
    """Base of every error the runtime reports to a client."""

    status = 500

    def __init__(self, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class InvalidRequest(ServingError):
    status = 400


class InvalidInput(InvalidRequest):
    status = 400


class ModelNotFound(ServingError):
    status = 404


class PayloadTooLarge(ServingError):
    status = 413


class Unavailable(ServingError):
    status = 503


class Overloaded(Unavailable):
    status = 503


class BackendError(ServingError):
    status = 500


class EngineLoadError(BackendError):
    status = 500


class InjectedFault(BackendError):
    status = 500
