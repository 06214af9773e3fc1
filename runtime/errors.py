"""The runtime's exception tree and its one mapping to HTTP status codes and gRPC codes.

=========================  ======  =================  ==========================================
exception                  HTTP    gRPC               when
=========================  ======  =================  ==========================================
``InvalidRequest``         400     INVALID_ARGUMENT   malformed JSON/binary body, bad parameters
``InvalidInput``           400     INVALID_ARGUMENT   wrong tensor name, shape, datatype or data
``ModelNotFound``          404     NOT_FOUND          model (or version) not in the configuration
``RouteNotFound``          404     UNIMPLEMENTED      no such endpoint
``MethodNotAllowed``       405     UNIMPLEMENTED      endpoint exists, not for this method
``RequestTimeout``         408     DEADLINE_EXCEEDED  the request body did not arrive in time
``PayloadTooLarge``        413     RESOURCE_EXHAUSTED body larger than ``maxRequestBytes``
``ClientDisconnected``     499     CANCELLED          the client went away before its request was
                                                      read (nginx's 499; nobody receives it)
``Unavailable``            503     UNAVAILABLE        server or model not ready
``Overloaded``             503     UNAVAILABLE        queue full or queue timeout (with Retry-After)
``BackendError``           500     INTERNAL           the backend failed to run a batch
``EngineLoadError``        500     INTERNAL           fetch, checksum, compatibility, deserialize
``InjectedFault``          500     INTERNAL           fault injection (``faults.errorRate``)
=========================  ======  =================  ==========================================

Each class carries its HTTP ``status`` and the name of its ``grpc.StatusCode`` (``grpc_code``,
a string so that this module imports no gRPC); :func:`as_serving_error` turns anything else a
handler raises into one of them, so both transports answer the same thing for the same fault.
"""

from __future__ import annotations


class ServingError(Exception):
    """Base of every error the runtime reports to a client."""

    status = 500
    grpc_code = "INTERNAL"

    def __init__(
        self,
        message: str,
        *,
        retry_after: int | None = None,
        waiting_on: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        # A load refused for lack of room that the end of these models' requests makes
        # (HTTP: the body's "waitingOn"; the replica's long-poll moves when they end).
        self.waiting_on = waiting_on


class InvalidRequest(ServingError):
    status = 400
    grpc_code = "INVALID_ARGUMENT"


class InvalidInput(InvalidRequest):
    status = 400


class ModelNotFound(ServingError):
    status = 404
    grpc_code = "NOT_FOUND"


class RouteNotFound(ServingError):
    status = 404
    grpc_code = "UNIMPLEMENTED"


class MethodNotAllowed(ServingError):
    status = 405
    grpc_code = "UNIMPLEMENTED"


class TierConflict(ServingError):
    """A tier move called off: the replica is still routed to, or was promoted meanwhile."""

    status = 409
    grpc_code = "FAILED_PRECONDITION"


class RequestTimeout(ServingError):
    status = 408
    grpc_code = "DEADLINE_EXCEEDED"


class PayloadTooLarge(ServingError):
    status = 413
    grpc_code = "RESOURCE_EXHAUSTED"


class ClientDisconnected(ServingError):
    """Not a server fault: counted apart (``code="499"``) so that error rates ignore it."""

    status = 499
    grpc_code = "CANCELLED"


class Unavailable(ServingError):
    status = 503
    grpc_code = "UNAVAILABLE"


class Overloaded(Unavailable):
    status = 503


class BackendError(ServingError):
    status = 500


class EngineLoadError(BackendError):
    status = 500


class InjectedFault(BackendError):
    status = 500


class InternalError(ServingError):
    """Anything unexpected: a bug, reported as 500 without taking the process down."""

    status = 500


def as_serving_error(exc: BaseException) -> ServingError:
    """The error a client is told about for ``exc`` (an unexpected one becomes a 500)."""
    if isinstance(exc, ServingError):
        return exc
    if isinstance(exc, ConnectionResetError):
        return ClientDisconnected("the client closed the connection")
    if isinstance(exc, RecursionError):
        return InvalidRequest("the request is nested too deeply")
    return InternalError(f"internal error: {exc}")
