"""Resolve a Service to its ready endpoints through EndpointSlices (the sandbox has no
kube-proxy, so clients — the demo, the load generator, tests — pick pod addresses themselves)."""

from __future__ import annotations

from typing import Any


def ready_endpoints(
    api_client: Any, namespace: str, service: str, port_name: str | None = "http"
) -> list[tuple[str, int]]:
    """(address, port) of every ready endpoint of ``service``, from its EndpointSlices: the
    port named ``port_name`` (the runtime's Service also has ``grpc``, which an HTTP client
    must not pick), or every port when None or when no port has that name (an unnamed one)."""
    from kubernetes import client

    discovery = client.DiscoveryV1Api(api_client)
    slices = discovery.list_namespaced_endpoint_slice(
        namespace, label_selector=f"kubernetes.io/service-name={service}"
    ).items
    out: list[tuple[str, int]] = []
    for sl in slices:
        named = [p for p in sl.ports or [] if p.port is not None]
        chosen = [p for p in named if port_name is not None and p.name == port_name]
        ports = [int(p.port) for p in (chosen or named)]
        for ep in sl.endpoints or []:
            if ep.conditions is not None and ep.conditions.ready is False:
                continue
            for addr in ep.addresses:
                out.extend((addr, port) for port in ports)
    return sorted(out)
