"""tidal.sandbox.peers and the aggregation layer's pieces, without a cluster: the APIService
objects that route a metrics API to a host process, the front-proxy certificates, and the API
server flags that stay off unless asked for (the test suite's control plane is unchanged)."""

from __future__ import annotations

import base64
from pathlib import Path

from cryptography import x509

from tidal.sandbox import Sandbox, SandboxConfig
from tidal.sandbox.peers import aggregated_api
from tidal.sandbox.pki import issue_serving_cert, make_front_proxy, make_pki


def test_aggregated_api_routes_a_group_version_to_a_host_address() -> None:
    svc, eps, api = aggregated_api(
        "metrics.k8s.io/v1beta1", "kube-system", "ms", "10.0.0.1", 7443, None
    )
    assert svc["spec"].get("selector") is None  # endpoints are ours, not a pod selector's
    assert eps["subsets"][0]["addresses"] == [{"ip": "10.0.0.1"}]
    assert eps["subsets"][0]["ports"][0]["port"] == 7443
    assert api["metadata"]["name"] == "v1beta1.metrics.k8s.io"
    assert api["spec"]["insecureSkipTLSVerify"] is True and "caBundle" not in api["spec"]
    *_, pinned = aggregated_api("external.metrics.k8s.io/v1beta1", "keda", "k", "h", 1, b"PEM")
    assert base64.b64decode(pinned["spec"]["caBundle"]) == b"PEM"
    assert "insecureSkipTLSVerify" not in pinned["spec"]


def test_front_proxy_client_is_signed_by_its_own_ca(tmp_path: Path) -> None:
    proxy = make_front_proxy(tmp_path)
    ca = x509.load_pem_x509_certificate(proxy.ca_cert.read_bytes())
    client = x509.load_pem_x509_certificate(proxy.client_cert.read_bytes())
    client.verify_directly_issued_by(ca)
    cn = client.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)[0].value
    assert cn == proxy.client_name


def test_serving_cert_names_ip_addresses_and_dns_names(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    crt, _ = issue_serving_cert(pki, tmp_path, "keda", ["10.245.0.1", "keda-operator.keda.svc"])
    cert = x509.load_pem_x509_certificate(crt.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["10.245.0.1"]
    assert sans.get_values_for_type(x509.DNSName) == ["keda-operator.keda.svc"]


def test_aggregation_flags_only_when_asked_for(tmp_path: Path) -> None:
    plain = Sandbox(SandboxConfig(state_dir=tmp_path / "a"))
    assert plain._aggregation_flags() == []
    opted = Sandbox(SandboxConfig(state_dir=tmp_path / "b", aggregation=True))
    opted.front_proxy = make_front_proxy(tmp_path / "b")
    flags = opted._aggregation_flags()
    assert "--enable-aggregator-routing=true" in flags
    assert any(f.startswith("--proxy-client-cert-file=") for f in flags)
