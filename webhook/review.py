"""AdmissionReview v1 shapes, typed so mypy checks the keys, and the three responses we give.

Every response echoes the request's UID (the apiserver drops a response that does not) and carries
``apiVersion``/``kind``; a patch is base64 JSONPatch, as the API requires.
"""

from __future__ import annotations

import base64
import json
from typing import Any, NotRequired, TypedDict


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


class BadReview(ValueError):
    """A body that is not an AdmissionReview v1 request."""


def parse_review(body: bytes) -> ReviewRequest:
    """The ``request`` of an AdmissionReview v1 body; raises BadReview otherwise."""
    try:
        review = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise BadReview(f"body is not JSON: {error}") from None
    if not isinstance(review, dict) or review.get("apiVersion") != API_VERSION:
        raise BadReview(f"expected an AdmissionReview of {API_VERSION}")
    request = review.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
        raise BadReview("the AdmissionReview has no request with a uid")
    return request  # type: ignore[return-value]


def _wrap(response: ReviewResponse) -> AdmissionReview:
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def allow(uid: str) -> AdmissionReview:
    return _wrap({"uid": uid, "allowed": True})


def deny(uid: str, message: str, code: int = 403) -> AdmissionReview:
    return _wrap({"uid": uid, "allowed": False, "status": {"code": code, "message": message}})


def patch(uid: str, operations: list[dict[str, Any]]) -> AdmissionReview:
    encoded = base64.b64encode(json.dumps(operations, separators=(",", ":")).encode()).decode()
    return _wrap({"uid": uid, "allowed": True, "patchType": "JSONPatch", "patch": encoded})
