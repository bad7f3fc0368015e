"""The chart's webhook.clientAuth: the webhook is installed answering only the API server's client
certificate, with the CA from wherever the values say, or one the webhook makes itself (with the
client certificate it trusts, tessera/webhook/client_ca.py); turning it off must be said in so many
words."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tessera.webhook.authentication import DEFAULT_CLIENT_NAME
from tessera.webhook.client_ca import client_material
from testbed.pki import CertificateAuthority
from tests.chart_helm import HelmError, find, render

CA_FILE = "/etc/tessera-webhook/client-ca/ca.crt"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm")


def webhook_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = find(objects, "Deployment", "tessera-webhook")["spec"]["template"]["spec"]
    return pod


def client_ca_volume(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod = webhook_pod(objects)
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "client-ca")
    assert mount == {"name": "client-ca", "mountPath": "/etc/tessera-webhook/client-ca", "readOnly": True}
    volume: dict[str, Any] = next(v for v in pod["volumes"] if v["name"] == "client-ca")
    return volume


def test_by_default_the_webhook_makes_a_client_ca_and_requires_its_certificate(home: Path) -> None:
    """No key material in the render (`helm template` would make new material each time): the
    webhook makes the CA and client certificate in the Secret the docs copy them from."""
    objects = render(home / "default")
    pod = webhook_pod(objects)
    args = pod["containers"][0]["args"]
    assert "--client-ca-secret=tessera-webhook-apiserver-client" in args
    assert "--namespace=tessera" in args
    assert f"--client-certificate-lifetime={3650 * 86400}" in args
    assert f"--client-names={DEFAULT_CLIENT_NAME}" in args
    assert "--allow-unauthenticated" not in args
    assert not [a for a in args if a.startswith("--client-ca-file")]
    assert "client-ca" not in {v["name"] for v in pod["volumes"]}
    assert not [o for o in objects if o["kind"] == "Secret"]
    [kept] = [r for r in find(objects, "Role", "tessera-webhook")["rules"] if "resourceNames" in r]
    assert "tessera-webhook-apiserver-client" in kept["resourceNames"]


def test_the_client_certificate_the_webhook_makes_is_signed_by_its_ca_for_the_first_allowed_name() -> None:
    material = client_material(
        DEFAULT_CLIENT_NAME, datetime.timedelta(days=3650), datetime.datetime.now(datetime.UTC)
    )
    ca = x509.load_pem_x509_certificate(material["ca.crt"])
    client = x509.load_pem_x509_certificate(material["tls.crt"])
    client.verify_directly_issued_by(ca)
    assert client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == DEFAULT_CLIENT_NAME
    usages = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usages
    assert b"PRIVATE KEY" in material["tls.key"]


def test_an_inline_ca_bundle_becomes_a_configmap_and_no_client_secret_is_made(
    home: Path, tmp_path: Path
) -> None:
    bundle = CertificateAuthority(tmp_path).pair.cert.read_text()
    objects = render(
        home / "inline",
        {"webhook": {"clientAuth": {"caBundle": bundle, "allowedNames": ["apiserver-a", "apiserver-b"]}}},
    )
    configmap = find(objects, "ConfigMap", "tessera-webhook-client-ca")
    assert configmap["data"]["ca.crt"].strip() == bundle.strip()
    assert client_ca_volume(objects)["configMap"] == {
        "name": "tessera-webhook-client-ca",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    assert "--client-names=apiserver-a,apiserver-b" in webhook_pod(objects)["containers"][0]["args"]
    assert not [o for o in objects if o["kind"] == "Secret" and "apiserver-client" in o["metadata"]["name"]]


@pytest.mark.parametrize(
    ("auth", "volume"),
    [
        (
            {"caSecret": "corp-ca"},
            {"secret": {"secretName": "corp-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        ),
        (
            {"caConfigMap": "corp-ca"},
            {"configMap": {"name": "corp-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        ),
    ],
)
def test_an_existing_secret_or_configmap_is_mounted_as_it_is(
    home: Path, auth: dict[str, str], volume: dict[str, Any]
) -> None:
    objects = render(home / "existing", {"webhook": {"clientAuth": auth}})
    assert client_ca_volume(objects) == {"name": "client-ca", **volume}
    assert not [
        o
        for o in objects
        if "client-ca" in o["metadata"]["name"] or "apiserver-client" in o["metadata"]["name"]
    ]


def test_two_sources_of_the_ca_are_refused(home: Path) -> None:
    with pytest.raises(HelmError, match="give at most one of caBundle, caSecret and caConfigMap"):
        render(home / "two", {"webhook": {"clientAuth": {"caSecret": "a", "caConfigMap": "b"}}})


def test_turning_authentication_off_is_explicit_and_mounts_nothing(home: Path) -> None:
    objects = render(home / "off", {"webhook": {"clientAuth": {"enabled": False}}})
    pod = webhook_pod(objects)
    assert "--allow-unauthenticated" in pod["containers"][0]["args"]
    assert not any(a.startswith("--client-") for a in pod["containers"][0]["args"])
    assert "client-ca" not in {v["name"] for v in pod["volumes"]}
    assert not [o for o in objects if o["kind"] == "Secret" and "apiserver-client" in o["metadata"]["name"]]
