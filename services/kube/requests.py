"""The writes the cluster write-back makes, as plain JSON requests on the `kubernetes` client's connection
(its configuration, authentication, TLS and connection pool).

Why not the generated API methods: each validates its arguments with pydantic (`validate_call`), turns a dict
body into the client's models and back, and deserialises the answer into models that the caller turns back
into dicts: about a third of the allocator's loop under a burst of cluster claims (py-spy). These calls send
the API's JSON and read it back, nothing else. Errors are the client's `ApiException`, with the status.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

MERGE_PATCH = "application/merge-patch+json"
TIMEOUT_S = 30.0
_CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
_PODS = "/api/v1/namespaces/{namespace}/pods/{name}"
_EVENTS = "/api/v1/namespaces/{namespace}/events"


class KubeRequests:
    """One method per call the allocator's RBAC grants (deploy/k8s/rbac-allocator.yaml)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    async def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return await self._send("GET", _path(_CLAIMS, namespace, name))

    async def patch_claim(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch of the claim (metadata: finalizers, annotations)."""
        return await self._send("PATCH", _path(_CLAIMS, namespace, name), patch, MERGE_PATCH)

    async def replace_claim_status(self, namespace: str, name: str, claim: dict[str, Any]) -> dict[str, Any]:
        """PUT to the status subresource: only `status` is taken, at the resourceVersion the body carries."""
        return await self._send("PUT", _path(_CLAIMS, namespace, name) + "/status", claim)

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return await self._send("PATCH", _path(_PODS, namespace, name), patch, MERGE_PATCH)

    async def patch_pod_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return await self._send("PATCH", _path(_PODS, namespace, name) + "/status", patch, MERGE_PATCH)

    async def evict_pod(self, namespace: str, name: str, uid: str) -> dict[str, Any]:
        """The Eviction API: the API server honours the pod's disruption budgets (429 when one refuses); only
        the pod of this uid (a pod recreated under the name is not the one that held the claim)."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace},
                "deleteOptions": {"preconditions": {"uid": uid}}}
        return await self._send("POST", _path(_PODS, namespace, name) + "/eviction", body)

    async def create_event(self, namespace: str, event: dict[str, Any]) -> dict[str, Any]:
        return await self._send("POST", _EVENTS.format(namespace=quote(namespace, safe="")), event)

    async def _send(self, method: str, path: str, body: Any = None,
                    content_type: str = "application/json") -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        request = await self.api.param_serialize(method=method, resource_path=path, header_params=headers,
                                                 body=body, auth_settings=["BearerToken"])
        response = await self.api.call_api(*request, _request_timeout=TIMEOUT_S)
        data = await response.read()
        if not 200 <= response.status < 300:
            raise ApiException(http_resp=response)
        answer = json.loads(data) if data else {}
        return answer if isinstance(answer, dict) else {}


def _path(template: str, namespace: str, name: str) -> str:
    return template.format(namespace=quote(namespace, safe=""), name=quote(name, safe=""))
