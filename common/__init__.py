"""Code shared by the runtime and the gateway, below both (``tidal.common``).

The runtime, the gateway and the operator are independent (an import-linter contract); what
the two HTTP servers must do alike (read a request body within limits, refuse client mistakes
with a JSON error, keep client faults out of the error log) lives here, imports neither of them,
and is imported by both.

What the operator and the runtime must agree on (how a byte quantity reads, the default engine
budget, a runtime pod's environment and ports) is :mod:`tidal.common.contract`.
How the runtime and the gateway read their flags, environment and configuration, and run
until signalled, is :mod:`tidal.common.settings`.
"""
