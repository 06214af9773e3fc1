"""What counts as an HTTP 403 in an operator log (tests that check RBAC read logs with it)."""

from __future__ import annotations

import pytest

from tidal.sandbox.operatorproc import http_forbidden


@pytest.mark.parametrize(
    "line",
    [
        "[2026-12-04 18:59:57,403] tidal.operator.leader released Lease",  # a timestamp (CI)
        "leading: Lease tidal-system/tidal-operator acquired by tidal-58ff9b7b7b-47hkm_2e38a403",
        "GET https://127.0.0.1:60403/api/v1/pods -> 200",  # a port
        # A namespace being deleted refuses new content with a 403: not a permission.
        'could not post event Created: POST /api/v1/namespaces/t-1/events: HTTP 403: events "x."'
        " is forbidden: unable to create new content in namespace t-1 because it is being"
        " terminated",
    ],
)
def test_digits_403_elsewhere_are_not_a_403(line: str) -> None:
    assert http_forbidden(line) is None


@pytest.mark.parametrize(
    "line",
    [
        "HTTP response headers ... (403)\nReason: Forbidden",
        "kubernetes.client.exceptions.ApiException: status=403",
        "APIForbiddenError('pods is forbidden', {'code': 403})",
        "PATCH https://10.96.0.1:443/apis/apps/v1/deployments/x -> 403",
        '10.0.0.1 "GET /x HTTP/1.1" 403 12',
    ],
)
def test_an_http_403_in_the_forms_clients_print_it_is_found(line: str) -> None:
    found = http_forbidden(line)
    assert found is not None and ("403" in found or "orbidden" in found), line


def test_a_real_403_after_a_terminating_namespace_one_is_still_found() -> None:
    log = (
        "POST /api/v1/namespaces/t-1/events: HTTP 403: events is forbidden: unable to create "
        "new content in namespace t-1 because it is being terminated\n"
        'PATCH /apis/apps/v1/namespaces/a/deployments/x: HTTP 403: deployments "x" is '
        'forbidden: User "system:serviceaccount:tidal-system:tidal" cannot patch\n'
    )
    found = http_forbidden(log)
    assert found is not None and "cannot patch" in found, found
