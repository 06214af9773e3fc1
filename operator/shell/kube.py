"""The operator's writes to the Kubernetes API: server-side apply, status, Events.

This module owns every request the operator makes outside kopf's watches. Requests are plain
REST calls through the ``kubernetes`` client's connection pool, run in worker threads so the
event loop never blocks. Every request is counted in ``tidal_operator_api_requests_total``.

Children are written with server-side apply under the field manager ``tidal-operator``: the
operator owns exactly the fields it sends and never touches (or fights over) fields other
writers own. ``force`` only takes back fields the operator sends, after someone else changed
them: the operator is the authority for those.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import socket
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from ..core.api import API_VERSION, KIND, PLURAL
from ..core.events import EventSpec, timestamp
from ..core.resources import ANNOTATION_APPLIED_HASH
from . import metrics

FIELD_MANAGER = "tidal-operator"
log = logging.getLogger("tidal.operator.kube")

_PATHS = {
    ("v1", "ConfigMap"): "/api/v1/namespaces/{ns}/configmaps/{name}",
    ("v1", "Service"): "/api/v1/namespaces/{ns}/services/{name}",
    ("apps/v1", "Deployment"): "/apis/apps/v1/namespaces/{ns}/deployments/{name}",
}


class KubeError(Exception):
    """A request failed. ``retryable`` says whether trying again later may succeed."""

    def __init__(self, message: str, *, status: int | None, retryable: bool) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable


def _error(exc: ApiException, what: str) -> KubeError:
    status = int(exc.status) if exc.status else None
    detail = exc.reason or ""
    try:
        detail = json.loads(exc.body or "{}").get("message", detail)
    except ValueError:
        pass
    retryable = status is None or status in (408, 409, 429) or status >= 500
    return KubeError(f"{what}: HTTP {status}: {detail}", status=status, retryable=retryable)


def _status_error(status: int, data: bytes | None, what: str) -> KubeError:
    detail = ""
    try:
        detail = json.loads(data or b"{}").get("message", "")
    except ValueError:
        detail = (data or b"")[:200].decode(errors="replace")
    retryable = status in (408, 409, 429) or status >= 500
    return KubeError(f"{what}: HTTP {status}: {detail}", status=status, retryable=retryable)


def load_client_config() -> client.Configuration:
    """In-cluster credentials when running in a pod, else the kubeconfig (``KUBECONFIG``)."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    # Enough connections for the worker threads (urllib3 would otherwise discard and reopen).
    configuration.connection_pool_maxsize = 32
    return configuration


@dataclass
class Kube:
    """Thin async facade over one ``kubernetes`` ApiClient.

    Requests run on a thread pool of their own (sized like the connection pool), so a burst of
    applies and Events neither waits behind nor starves the loop's default executor.
    """

    api: client.ApiClient
    threads: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(32, thread_name_prefix="kube")
    )

    @classmethod
    def from_environment(cls) -> Kube:
        return cls(client.ApiClient(load_client_config()))

    async def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self.threads, functools.partial(self._request, method, path, **kwargs)
        )

    def _request(
        self,
        method: str,
        path: str,
        *,
        resource: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """One blocking request (run it in a thread); raises :class:`KubeError`."""
        metrics.API_REQUESTS.labels(verb=method.lower(), resource=resource).inc()
        verb, url, headers, payload, _ = self.api.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self.api.call_api(
                verb, url, header_params=headers, body=payload, _request_timeout=30
            )
        except ApiException as exc:  # transport-level failure
            raise _error(exc, f"{method} {path}") from None
        data: bytes | None = response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status < 300:
            raise _status_error(response.status, data, f"{method} {path}")
        return dict(json.loads(data)) if data else {}

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply one child (ConfigMap, Service or Deployment)."""
        meta = obj["metadata"]
        path = _PATHS[(obj["apiVersion"], obj["kind"])].format(
            ns=meta["namespace"], name=meta["name"]
        )
        what = f"apply {obj['kind']} {meta['namespace']}/{meta['name']}"
        try:
            return await self._call(
                "PATCH",
                path,
                resource=str(obj["kind"]).lower(),
                body=dict(obj),
                query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
                content_type="application/apply-patch+yaml",
            )
        except KubeError as exc:
            raise KubeError(f"{what}: {exc}", status=exc.status, retryable=exc.retryable) from None

    async def patch_status(
        self, namespace: str, name: str, status: Mapping[str, Any], plural: str = PLURAL
    ) -> None:
        """Replace the status (JSON merge patch on the status subresource) of an
        InferenceService, or of another kind of this group by its ``plural``.

        Lists (conditions) are replaced whole, and fields the new status leaves out are
        removed (sent as null), so the stored status is exactly the computed one.
        """
        path = f"/apis/{API_VERSION}/namespaces/{namespace}/{plural}/{name}/status"
        try:
            await self._call(
                "PATCH",
                path,
                resource=f"{plural}/status",
                body={"status": status},
                content_type="application/merge-patch+json",
            )
        except KubeError as exc:
            if exc.status == 404:  # deleted meanwhile: nothing left to report on
                return
            raise

    async def get_config_map(self, namespace: str, name: str) -> dict[str, Any]:
        """One ConfigMap (the fleet loop's saved state); a missing one raises status 404."""
        path = _PATHS[("v1", "ConfigMap")].format(ns=namespace, name=name)
        return await self._call("GET", path, resource="configmap")

    async def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """JSON merge patch of a pod's metadata (role label, pod-deletion-cost annotation).

        Only labels and annotations the ReplicaSet does not select on are touched, so the
        ReplicaSet never fights over them. A pod gone meanwhile is no error.
        """
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        try:
            await self._call(
                "PATCH",
                path,
                resource="pods",
                body=dict(patch),
                query=[("fieldManager", FIELD_MANAGER + "-pods")],
                content_type="application/merge-patch+json",
            )
        except KubeError as exc:
            if exc.status != 404:
                raise

    async def scale_deployment(self, namespace: str, name: str, replicas: int) -> None:
        """Set only a Deployment's replicas (its template is held during a staged rollout)."""
        path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}"
        await self._call(
            "PATCH",
            path,
            resource="deployment",
            body={"spec": {"replicas": replicas}},
            query=[("fieldManager", FIELD_MANAGER)],
            content_type="application/merge-patch+json",
        )

    async def retire_deployment(self, namespace: str, name: str) -> None:
        """Scale a Deployment the operator no longer wants to zero pods, and mark its applied
        hash ``retired`` so that wanting it again applies it whole. A Deployment gone
        meanwhile is no error."""
        path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}"
        try:
            await self._call(
                "PATCH",
                path,
                resource="deployment",
                body={
                    "metadata": {"annotations": {ANNOTATION_APPLIED_HASH: "retired"}},
                    "spec": {"replicas": 0},
                },
                query=[("fieldManager", FIELD_MANAGER)],
                content_type="application/merge-patch+json",
            )
        except KubeError as exc:
            if exc.status != 404:
                raise

    async def create_job(self, job: Mapping[str, Any]) -> bool:
        """Create a Job; False when one of that name exists already (names are digests of
        their inputs, so it is the same Job)."""
        meta = job["metadata"]
        try:
            await self._call(
                "POST",
                f"/apis/batch/v1/namespaces/{meta['namespace']}/jobs",
                resource="jobs",
                body=dict(job),
            )
        except KubeError as exc:
            if exc.status == 409:
                return False
            raise KubeError(
                f"create Job {meta['namespace']}/{meta['name']}: {exc}",
                status=exc.status,
                retryable=exc.retryable,
            ) from None
        return True

    async def list_node_labels(self) -> dict[str, dict[str, str]] | None:
        """Every node's labels by name; None when the operator may not list nodes."""
        try:
            data = await self._call("GET", "/api/v1/nodes", resource="nodes")
        except KubeError as exc:
            if exc.status in (401, 403):
                return None
            raise
        return {
            str(item["metadata"]["name"]): dict(item["metadata"].get("labels") or {})
            for item in data.get("items", [])
        }

    async def post_event(self, isvc: Mapping[str, Any], event: EventSpec, now: datetime) -> None:
        """Post a core/v1 Event about an InferenceService (or another object of this group:
        its ``kind`` says which); failures are logged, not raised."""
        meta = isvc["metadata"]
        when = timestamp(now)
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": isvc.get("kind") or KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": event.type,
            "reason": event.reason,
            "message": event.message[:1024],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": socket.gethostname(),
            "firstTimestamp": when,
            "lastTimestamp": when,
            "count": 1,
        }
        try:
            await self._call(
                "POST",
                f"/api/v1/namespaces/{meta['namespace']}/events",
                resource="events",
                body=body,
            )
        except KubeError as exc:
            log.warning("could not post event %s: %s", event.reason, exc)
