"""The self-made CA rotates and the webhook keeps the configuration's caBundle current: after a
rotation the apiserver still calls the webhook, through a certificate signed by the new CA.

Lifetimes are shortened to a minute so a rotation happens during the test; the rotation itself is
driven by polling ``refresh`` (as the daemon's maintenance loop does), never by a stopwatch.
"""

from __future__ import annotations

import base64
import datetime

import pytest
from cryptography import x509
from kubernetes import client

from tessera.kube import raw_json
from tessera.webhook.tls import keep_ca_bundle
from testbed.cluster import LocalCluster
from testbed.polling import poll_until
from tests.integration.webhook_bed import RunningWebhook

pytestmark = pytest.mark.integration


def bundle_in_configuration(kube: client.ApiClient, name: str) -> list[x509.Certificate]:
    body = raw_json(
        client.AdmissionregistrationV1Api(kube).read_mutating_webhook_configuration(
            name, _preload_content=False
        )
    )
    return x509.load_pem_x509_certificates(base64.b64decode(body["webhooks"][0]["clientConfig"]["caBundle"]))


def test_after_a_ca_rotation_the_bundle_is_updated_and_the_apiserver_still_calls_the_webhook(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str
) -> None:
    webhook = RunningWebhook(
        kube,
        cluster,
        ca_lifetime=datetime.timedelta(seconds=60),
        serving_lifetime=datetime.timedelta(seconds=30),
    )
    try:
        webhook.wait_effective(namespace)
        [first_ca] = bundle_in_configuration(kube, webhook.name)
        assert (
            keep_ca_bundle(webhook.api, webhook.name, webhook.certificates.ca_bundle()) is False
        )  # unchanged: no write

        def rotated_ca() -> bool:
            webhook.certificates.refresh()
            return len(x509.load_pem_x509_certificates(webhook.certificates.ca_bundle())) == 2

        poll_until(rotated_ca, 120, "a second CA in the bundle")
        serving = x509.load_pem_x509_certificate(webhook.certificates.serving_certificate())
        old_ca, new_ca = x509.load_pem_x509_certificates(webhook.certificates.ca_bundle())
        assert old_ca == first_ca
        serving.verify_directly_issued_by(new_ca)
        assert keep_ca_bundle(webhook.api, webhook.name, webhook.certificates.ca_bundle()) is True
        assert bundle_in_configuration(kube, webhook.name) == [old_ca, new_ca]
        webhook.wait_effective(namespace)  # served with the new CA's certificate, trusted through the bundle
    finally:
        webhook.stop()
