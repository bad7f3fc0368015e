"""Make sure the right ResourceClaimTemplate exists before the pod that references it is admitted.

Templates are named by the hash of their spec, so a template that already has the name is the right
one only if Tessera made it: anyone allowed to create templates in a namespace can plant one under
that name in advance, with a bigger request than the pod asked for (and than Kueue charged). So a
create that meets AlreadyExists reads the template and uses it only if it carries the webhook's
``app.kubernetes.io/managed-by`` label and the identical spec, the recorded request in its claim
metadata included (the admission check trusts that record, so a template whose record and CEL
disagree is as foreign as one with a bigger request); otherwise the pod is denied with a
sentence that names the template.

A create is safe to send twice (the name is the spec's hash, and AlreadyExists leads to the
verification above), so one whose connection is lost before any answer (the API server stopping
or restarting between reading it and answering, or a pooled connection it closed just then) is sent
once more on a new connection: the client library retries no POST, and the pod would be refused
for it (failurePolicy Fail).

A template's spec is immutable in resource.k8s.io/v1, so a template verified once stays right for as
long as the same object (the same UID) exists. Verified templates are remembered for ``ttl`` seconds
so a warm webhook makes no API call per pod, and a watch of the webhook's templates forgets one the
moment it is deleted: a replacement planted after a delete is a new object, met by the next create
and verified again. Where the watch breaks, its relist keeps only the templates still there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client import ApiException
from urllib3.exceptions import ProtocolError

from tessera.gpu_request import Refusal
from tessera.kube import raw_json
from tessera.names import MANAGED_BY_LABEL, WEBHOOK_MANAGED_BY
from tessera.quantity import parse_quantity
from tessera.watching import WatchThread

log = logging.getLogger(__name__)

_FORGOTTEN = 4096
"""UIDs of deleted templates remembered, so a verification that raced the deletion is not cached."""


def same_spec(existing: Any, ours: Any) -> bool:
    """Whether two template specs ask for the same thing, as the API stores them: quantities under
    ``capacity`` compared by value (the API writes 81920Mi back as 80Gi) and empty members dropped
    (it writes an empty claim metadata)."""
    return bool(_canonical(existing) == _canonical(ours))


def _canonical(value: Any) -> Any:
    if isinstance(value, Mapping):
        out = {k: _capacity(v) if k == "capacity" else _canonical(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in ({}, [], None)}
    if isinstance(value, list):
        return [_canonical(item) for item in value]
    return value


def _capacity(value: Any) -> Any:
    """A ``capacity`` member: each section's quantities by value (unparseable ones as they are)."""
    if not isinstance(value, Mapping):
        return value
    out: dict[str, Any] = {}
    for section, quantities in value.items():
        if not isinstance(quantities, Mapping):
            out[section] = quantities
            continue
        parsed: dict[str, Any] = {}
        for name, quantity in quantities.items():
            try:
                parsed[name] = parse_quantity(quantity)
            except ValueError:
                parsed[name] = quantity
        out[section] = parsed
    return out


def check_existing(existing: Mapping[str, Any], template: Mapping[str, Any]) -> None:
    """Raise Refusal, naming the template, unless ``existing`` is the one the webhook would write."""
    metadata = template["metadata"]
    where = f"{metadata['namespace']}/{metadata['name']}"
    labels = (existing.get("metadata") or {}).get("labels") or {}
    if labels.get(MANAGED_BY_LABEL) != WEBHOOK_MANAGED_BY:
        raise Refusal(
            f"ResourceClaimTemplate {where} already exists without the label "
            f"{MANAGED_BY_LABEL}={WEBHOOK_MANAGED_BY}, so Tessera did not make it and will not use it; "
            "delete it and create the pod again."
        )
    if not same_spec(existing.get("spec"), template["spec"]):
        raise Refusal(
            f"ResourceClaimTemplate {where} already exists with a spec other than the one Tessera "
            "writes for this pod, so Tessera will not use it; delete it and create the pod again."
        )


class TemplateStore:
    """Creates templates, verifies the ones that exist, remembers verified ones; thread-safe."""

    def __init__(
        self, api: client.ApiClient, ttl: float = 300.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._resource = client.ResourceV1Api(api)
        self._ttl = ttl
        self._clock = clock
        self._known: dict[tuple[str, str], tuple[str, float]] = {}
        """(namespace, name) -> (UID of the verified template, when to verify again)."""
        self._gone: deque[str] = deque(maxlen=_FORGOTTEN)
        self._lock = threading.Lock()
        self._watch = WatchThread(
            self._resource.list_resource_claim_template_for_all_namespaces,
            self._handle,
            "ResourceClaimTemplates",
            "template-watch",
            label_selector=f"{MANAGED_BY_LABEL}={WEBHOOK_MANAGED_BY}",
        )

    def ensure(self, template: Mapping[str, Any]) -> bool:
        """Create ``template`` unless a verified one is known; True if the API was called. Raises
        Refusal for a template of that name that Tessera did not write, ApiException on failures."""
        namespace, name = template["metadata"]["namespace"], template["metadata"]["name"]
        key = (namespace, name)
        now = self._clock()
        with self._lock:
            if key in self._known and self._known[key][1] > now:
                return False
        body = client.V1ResourceClaimTemplate.model_validate(dict(template))
        create = self._resource.create_namespaced_resource_claim_template
        try:
            try:
                created = raw_json(create(namespace, body, _preload_content=False))
            except ProtocolError as lost:  # the module says why a second send is safe
                log.warning(
                    "creating template %s/%s: connection lost (%s); sending it again", namespace, name, lost
                )
                created = raw_json(create(namespace, body, _preload_content=False))
        except ApiException as error:
            if error.status != 409:
                raise
            read = self._resource.read_namespaced_resource_claim_template
            created = raw_json(read(name, namespace, _preload_content=False))
            check_existing(created, template)
        uid = str(created["metadata"]["uid"])
        with self._lock:
            if uid not in self._gone:
                self._known[key] = (uid, now + self._ttl)
        return True

    def _handle(self, kind: str, obj: Mapping[str, Any]) -> None:
        """Watch events of the webhook's templates: forget deleted ones, and after a relist every one
        no longer there (a deletion may have happened while the watch was down)."""
        with self._lock:
            if kind == "SYNCED":
                present = {item["metadata"]["uid"] for item in obj["items"]}
                self._known = {k: v for k, v in self._known.items() if v[0] in present}
            elif kind == "DELETED":
                metadata = obj["metadata"]
                self._gone.append(metadata["uid"])
                key = (metadata.get("namespace", ""), metadata["name"])
                if key in self._known and self._known[key][0] == metadata["uid"]:
                    del self._known[key]

    def start(self) -> None:
        self._watch.start()

    def stop(self) -> None:
        self._watch.stop()
