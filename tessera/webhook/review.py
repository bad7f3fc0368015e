"""AdmissionReview v1 shapes, typed so mypy checks the keys, and the three responses we give.

Every response echoes the request's UID (the apiserver drops a response that does not) and carries
``apiVersion``/``kind``; a patch is base64 JSONPatch, as the API requires.
"""

from __future__ import annotations

import base64
import json
from typing import Any, NotRequired, TypedDict

from tessera.quantity import quote


class ReviewRequest(TypedDict):
    uid: str
    kind: dict[str, str]
    operation: str
    namespace: NotRequired[str]
    object: NotRequired[dict[str, Any]]
    dryRun: NotRequired[bool]


class Status(TypedDict):
    code: int
    message: str


class ReviewResponse(TypedDict):
    uid: str
    allowed: bool
    status: NotRequired[Status]
    patchType: NotRequired[str]
    patch: NotRequired[str]
    warnings: NotRequired[list[str]]


class AdmissionReview(TypedDict):
    apiVersion: str
    kind: str
    response: ReviewResponse


API_VERSION = "admission.k8s.io/v1"


MAX_UID = 128
"""Characters of a request UID we echo back (the apiserver's are 36)."""


class BadReview(ValueError):
    """A body that is not an AdmissionReview v1 request; the message is one sentence."""


def parse_review(body: bytes) -> ReviewRequest:
    """The ``request`` of an AdmissionReview v1 body, its shape checked (see :func:`check_request`);
    raises BadReview otherwise."""
    try:
        review = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise BadReview("the body is not JSON.") from None
    if not isinstance(review, dict) or review.get("apiVersion") != API_VERSION:
        raise BadReview(f"expected an AdmissionReview of {API_VERSION}.")
    request = review.get("request")
    if not isinstance(request, dict):
        raise BadReview("the AdmissionReview has no request.")
    check_request(request)
    return request  # type: ignore[return-value]


_JSON_NAMES = {dict: "JSON object", list: "JSON array", str: "string", bool: "boolean", int: "number"}


def _expect(value: Any, kinds: type | tuple[type, ...], what: str, optional: bool = True) -> None:
    """Raise BadReview unless ``value`` is one of ``kinds`` (or absent, when ``optional``)."""
    if (value is None and optional) or isinstance(value, kinds):
        return
    names = " or ".join(_JSON_NAMES[kind] for kind in (kinds if isinstance(kinds, tuple) else (kinds,)))
    raise BadReview(f"the review's {what} is not a {names}.")


def check_request(request: dict[str, Any]) -> None:
    """Check every part of ``request`` that the webhook reads, so bad input is refused here with a
    sentence (HTTP 400) and never reaches the decision as a surprise (HTTP 500).

    The apiserver always sends a UID, the kind, the operation, and for a namespaced object its
    namespace, the same as the object's own: a review that breaks these was not sent by it. The
    namespace rule matters beyond shape: templates are created in the review's namespace, so it must
    be the namespace of the pod under review."""
    uid = request.get("uid")
    if not isinstance(uid, str) or not 0 < len(uid) <= MAX_UID:
        raise BadReview(f"the review's request has no uid of 1 to {MAX_UID} characters.")
    _expect(request.get("kind"), dict, "request.kind", optional=False)
    _expect(request["kind"].get("kind"), str, "request.kind.kind")
    _expect(request.get("operation"), str, "request.operation")
    _expect(request.get("namespace"), str, "request.namespace")
    _expect(request.get("dryRun"), bool, "request.dryRun")
    _expect(request.get("object"), dict, "request.object")
    pod = request.get("object")
    if request.get("operation") != "CREATE" or request["kind"].get("kind") != "Pod" or not pod:
        return
    namespace = request.get("namespace")
    if not namespace:
        raise BadReview("the review of a Pod CREATE has no namespace.")
    metadata = pod.get("metadata")
    _expect(metadata, dict, "pod metadata")
    metadata = metadata or {}
    _expect(metadata.get("namespace"), str, "pod namespace")
    if metadata.get("namespace") and metadata["namespace"] != namespace:
        theirs = quote(metadata["namespace"])
        raise BadReview(f"the review's namespace {quote(namespace)} is not its pod's namespace {theirs}.")
    _expect(metadata.get("annotations"), dict, "pod annotations")
    for key, value in (metadata.get("annotations") or {}).items():
        _expect(value, str, f"pod annotation {quote(key)}", optional=False)
    spec = pod.get("spec")
    _expect(spec, dict, "pod spec")
    spec = spec or {}
    _expect(spec.get("os"), dict, "pod spec.os")
    _check_security(spec, "pod spec")
    _expect(spec.get("resourceClaims"), list, "pod spec.resourceClaims")
    for entry in spec.get("resourceClaims") or []:
        _expect(entry, dict, "pod spec.resourceClaims entry", optional=False)
    for list_name in ("initContainers", "containers"):
        _expect(spec.get(list_name), list, f"pod spec.{list_name}")
        for container in spec.get(list_name) or []:
            _expect(container, dict, f"pod spec.{list_name} entry", optional=False)
            _expect(container.get("name"), str, f"pod spec.{list_name} entry's name")
            _check_security(container, f"pod spec.{list_name} entry's")
            resources = container.get("resources")
            _expect(resources, dict, f"pod spec.{list_name} entry's resources")
            for section in ("limits", "requests"):
                values = (resources or {}).get(section)
                _expect(values, dict, f"pod spec.{list_name} entry's resources.{section}")
                for name, value in (values or {}).items():
                    _expect(value, (str, int), f"quantity {quote(name)}", optional=False)
            _expect((resources or {}).get("claims"), list, f"pod spec.{list_name} entry's resources.claims")


def _check_security(holder: dict[str, Any], what: str) -> None:
    """The ``securityContext.seccompProfile.type`` of a pod spec or a container, as far as present,
    is the shape the seccomp decision reads (tessera/webhook/seccomp.py)."""
    security = holder.get("securityContext")
    _expect(security, dict, f"{what} securityContext")
    profile = (security or {}).get("seccompProfile")
    _expect(profile, dict, f"{what} securityContext.seccompProfile")
    _expect((profile or {}).get("type"), str, f"{what} securityContext.seccompProfile.type")


def _wrap(response: ReviewResponse) -> AdmissionReview:
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def allow(uid: str) -> AdmissionReview:
    return _wrap({"uid": uid, "allowed": True})


def deny(uid: str, message: str, code: int = 403) -> AdmissionReview:
    return _wrap({"uid": uid, "allowed": False, "status": {"code": code, "message": message}})


def patch(uid: str, operations: list[dict[str, Any]], warnings: list[str] | None = None) -> AdmissionReview:
    """Allow with ``operations``; ``warnings`` go back to the user (kubectl prints each as
    ``Warning: ...``)."""
    encoded = base64.b64encode(json.dumps(operations, separators=(",", ":")).encode()).decode()
    response: ReviewResponse = {"uid": uid, "allowed": True, "patchType": "JSONPatch", "patch": encoded}
    if warnings:
        response["warnings"] = warnings
    return _wrap(response)
