"""The admission check's place in the tree: importable as tessera.admissioncheck, linted, a console
entry point, and independent of the test bed; of the webhook it uses only the pure conversion."""

from __future__ import annotations

from tests.component_layout import (
    REPO,
    console_scripts,
    imported_modules,
    linked_into_import_root,
    linted,
    stray_imports,
)


def test_the_admission_check_imports_shared_helpers_and_the_webhooks_pure_conversion_only() -> None:
    allowed = (
        "tessera.admissioncheck",
        "tessera.names",
        "tessera.quantity",
        "tessera.watching",
        "tessera.kube",
        "tessera.logs",
        "tessera.settings",
        "tessera.webhook.conversion",
        "tessera.webhook.selectors",
    )
    assert stray_imports("admissioncheck", allowed) == {}


def test_fit_is_pure() -> None:
    imports = imported_modules(REPO / "admissioncheck" / "fit.py")
    assert not {name for name in imports if name.startswith(("kubernetes", "threading", "socket", "http"))}


def test_the_admission_check_is_linked_into_the_import_root_linted_and_installed() -> None:
    assert linked_into_import_root("admissioncheck")
    assert linted("admissioncheck")
    assert console_scripts()["tessera-admission-check"] == "tessera.admissioncheck.cli:main"
