"""The webhook's place in the tree: importable as tessera.webhook, linted, and independent of the
test bed and of the other components (it ships alone, in its own image)."""

from __future__ import annotations

from tests.component_layout import console_scripts, linked_into_import_root, linted, stray_imports


def test_the_webhook_imports_only_shared_helpers_and_itself() -> None:
    allowed = (
        "tessera.webhook",
        "tessera.names",
        "tessera.quantity",
        "tessera.watching",
        "tessera.kube",
        "tessera.logs",
        "tessera.settings",
    )
    assert stray_imports("webhook", allowed) == {}


def test_the_webhook_is_linked_into_the_import_root_linted_and_installed() -> None:
    assert linked_into_import_root("webhook")
    assert linted("webhook")
    assert console_scripts()["tessera-webhook"] == "tessera.webhook.cli:main"
