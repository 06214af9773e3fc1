"""tidal.gateway: the model-aware OIP v2 proxy in front of a fleet of tidal runtimes.

It forwards each request to a replica where the model is hot (least outstanding requests), asks
a replica to load a cold model (bounded per replica and fleet-wide) while it holds the request
until the model is ready or the request's deadline passes, and learns the hot sets from each
runtime's ``GET /v2/tidal/models`` long-poll.  The routing decision is the pure
:func:`tidal.gateway.core.routing.choose_route`; :mod:`tidal.gateway.server` is the aiohttp shell.
"""

__version__ = "0.1.0"
SERVER_NAME = "tidal-gateway"  # what GET /v2 and gRPC ServerMetadata name
EXTENSIONS = ("binary_tensor_data", "model_repository")
