"""One model of a GPU request, for every part that reads or writes one; pure.

The webhook reads a container's HAMi resources and its pod's HAMi annotations into a
:class:`GpuRequest` and converts it into a ResourceClaimTemplate; the admission check reads the same
resources from a Job's pod template, and reads the requests the webhook converted back from the
annotation :data:`~tessera.names.GPU_REQUEST_ANNOTATION` the webhook records on each template. One
model and one pair of functions for that annotation (:func:`request_to_annotation`,
:func:`request_from_annotation`) mean the two parts cannot drift: neither parses what the other
wrote in another language (CEL).

Reading rule: for each of the four resource names the container's ``limits`` value is used, else its
``requests`` value (Kubernetes requires the two to be equal for extended resources, and a container
may give either); if both are given and differ the pod is refused. Defaults, for what HAMi users
expect on a driver whose request policy reserves nothing that a claim does not name:

- ``nvidia.com/gpu`` is 1 when only gpumem, gpumem-percentage or gpucores is given;
- no gpumem and no gpumem-percentage means 100 % of each GPU's memory (HAMi's default), never the
  device's default of 0, which would leave the container unable to allocate anything;
- no gpucores means no compute cap (the device's default 0: time-sliced with everyone else).

Beside the four, a container may carry ``nvidia.com/priority`` (0 high, 1 low: the default) and the
environment variable ``CUDA_DISABLE_CONTROL=true`` (HAMi's opt-out of enforcement, which here means a
whole GPU without limits); both are settings of its share. ``nvidia.com/mig-<profile>: N`` asks for
MIG instances instead (:class:`MigRequest`), and a container may not ask for both kinds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera.names import (
    GPU_REQUEST_ANNOTATION,
    HAMI_DISABLE_CONTROL,
    HAMI_GPU,
    HAMI_GPUCORES,
    HAMI_GPUMEM,
    HAMI_GPUMEM_PERCENTAGE,
    HAMI_MIG_PREFIX,
    HAMI_NOUSE_TYPE,
    HAMI_NOUSE_UUID,
    HAMI_PRIORITY,
    HAMI_RESOURCES,
    HAMI_USE_TYPE,
    HAMI_USE_UUID,
)
from tessera.quantity import MiB, parse_quantity, quote, round_down
from tessera.slices import WHOLE_GPU_CORES

DEFAULT_MEMORY_PERCENT = 100

DEFAULT_PRIORITY = 1
"""HAMi's default task priority (low); 0 is high."""

MAX_MEMORY_SIZES = 8
"""A percentage becomes one ``firstAvailable`` choice per GPU memory size; DRA allows at most 8."""

MAX_ANNOTATION_LENGTH = 2048
"""Longest HAMi annotation value accepted: keeps every selector far below CEL's 10 KiB limit."""

_UUID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
"""What a GPU UUID looks like (``GPU-8a1f...``, ``MIG-...``); anything else is a typo worth refusing."""


class Refusal(ValueError):
    """A request no GPU could satisfy on its own; the message is one sentence naming container,
    resource and rule (the webhook denies the pod with it, the admission check rejects the Workload)."""


class AnnotationError(ValueError):
    """A HAMi annotation that cannot be turned into a selection; the message is one sentence."""


class RecordError(ValueError):
    """A :data:`~tessera.names.GPU_REQUEST_ANNOTATION` value that is not a request this version
    reads; the message is one sentence."""


# -- which GPUs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """Which GPUs a pod may use, as the four HAMi annotations say. ``None`` means the annotation is
    absent; entries are unique, type entries lower-cased. The webhook writes it as CEL and the
    admission check decides with :meth:`matches`, which must say what that CEL says."""

    use_uuids: tuple[str, ...] | None = None
    nouse_uuids: tuple[str, ...] | None = None
    use_types: tuple[str, ...] | None = None
    nouse_types: tuple[str, ...] | None = None

    @property
    def names_uuids(self) -> bool:
        return self.use_uuids is not None or self.nouse_uuids is not None

    def matches(self, uuid: str, product_name: str) -> bool:
        """Whether a GPU with this UUID and product name passes every selector: UUIDs exactly, types
        when an entry is part of the product name, ignoring case, as HAMi does."""
        product = product_name.lower()
        if self.use_uuids is not None and uuid not in self.use_uuids:
            return False
        if self.nouse_uuids is not None and uuid in self.nouse_uuids:
            return False
        if self.use_types is not None and not any(t in product for t in self.use_types):
            return False
        return not (self.nouse_types is not None and any(t in product for t in self.nouse_types))


def _split_list(annotation: str, value: str) -> list[str]:
    """The comma-separated entries of an annotation, trimmed; refuses empty entries and empty lists."""
    if len(value) > MAX_ANNOTATION_LENGTH:
        raise AnnotationError(f"annotation {annotation} is longer than {MAX_ANNOTATION_LENGTH} characters.")
    entries = [entry.strip() for entry in value.split(",")]
    if not any(entries):
        raise AnnotationError(f"annotation {annotation} names no value.")
    if not all(entries):
        raise AnnotationError(f"annotation {annotation} has an empty entry in {value!r}.")
    return entries


def uuid_entries(annotation: str, value: str) -> tuple[str, ...]:
    entries = _split_list(annotation, value)
    for entry in entries:
        if not _UUID.match(entry):
            raise AnnotationError(f"annotation {annotation} has {entry!r}, which is not a GPU UUID.")
    return tuple(dict.fromkeys(entries))


def _type_entries(annotation: str, value: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(entry.lower() for entry in _split_list(annotation, value)))


_SELECTION_ANNOTATIONS = (
    ("use_uuids", HAMI_USE_UUID, uuid_entries),
    ("nouse_uuids", HAMI_NOUSE_UUID, uuid_entries),
    ("use_types", HAMI_USE_TYPE, _type_entries),
    ("nouse_types", HAMI_NOUSE_TYPE, _type_entries),
)


def selection_for(annotations: Mapping[str, str]) -> Selection:
    """The Selection the HAMi annotations among a pod's ``annotations`` ask for; raises
    AnnotationError."""
    found = {
        name: read(annotation, annotations[annotation])
        for name, annotation, read in _SELECTION_ANNOTATIONS
        if annotation in annotations
    }
    return Selection(**found)


# -- how much --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuRequest:
    """What one container asks for, after defaults: ``count`` GPUs, on each ``memory`` bytes or
    ``memory_percent`` of the GPU's memory (exactly one is set), ``cores`` percent of its time (None:
    uncapped), on GPUs ``selection`` admits, at task ``priority``; ``enforce`` False is HAMi's
    ``CUDA_DISABLE_CONTROL=true``: the whole GPU, and the driver loads no limits.

    ``memory_sizes`` is set once the webhook has converted a percentage: the GPU memory sizes its
    claim has a choice for, largest first (the fleet's when it wrote the claim)."""

    count: int
    memory: int | None
    memory_percent: int | None
    cores: int | None
    selection: Selection = field(default_factory=Selection)
    memory_sizes: tuple[int, ...] = ()
    priority: int = DEFAULT_PRIORITY
    enforce: bool = True


@dataclass(frozen=True)
class MigRequest:
    """``count`` MIG instances of ``profile`` (``nvidia.com/mig-<profile>: <count>``)."""

    profile: str
    count: int


def share_of(size: int, percent: int) -> int:
    """The memory ``percent`` of a GPU of ``size`` bytes comes to: whole MiB, as the claim asks it."""
    return round_down(size * percent // 100, MiB)


def _whole_number(where: str, name: str, raw: Any) -> int:
    """``raw`` as a whole number of at least 1, through the one bounded parser: a pod may carry any
    string here (the API validates extended resources only after mutating admission)."""
    try:
        value = parse_quantity(raw)
    except ValueError as error:
        raise Refusal(f"{where}: {name} is refused: {error}") from None
    if value.denominator != 1:
        raise Refusal(f"{where}: {name} is {quote(raw)}, which is not a whole number.")
    if value <= 0:
        raise Refusal(f"{where}: {name} is {quote(raw)}; it must be at least 1.")
    return int(value)


def _read(where: str, resources: Mapping[str, Any], name: str) -> int | None:
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    limit = _whole_number(where, name, limits[name]) if name in limits else None
    request = _whole_number(where, name, requests[name]) if name in requests else None
    if limit is not None and request is not None and limit != request:
        raise Refusal(
            f'{where}: {name} has request "{requests[name]}" and limit "{limits[name]}"; they must be equal.'
        )
    return limit if limit is not None else request


def _named(resources: Mapping[str, Any], test: Any) -> list[str]:
    """The resource names in ``limits`` or ``requests`` for which ``test(name)`` holds, each once."""
    names = [*(resources.get("limits") or {}), *(resources.get("requests") or {})]
    return list(dict.fromkeys(name for name in names if isinstance(name, str) and test(name)))


_MIG_PROFILE = re.compile(r"^[0-9][A-Za-z0-9.+_-]{0,31}$")
"""What follows ``nvidia.com/mig-``: a MIG profile such as ``1g.10gb`` or ``1g.5gb+me``, at most 32
characters; the webhook writes it into CEL only as a quoted string."""


def read_mig(where: str, container: Mapping[str, Any]) -> MigRequest | None:
    """The container's ``nvidia.com/mig-<profile>: N``, None if it names none; raises Refusal for a
    malformed profile, a count below 1, two profiles, or MIG beside share resources (a container
    sees one device kind: a MIG instance has no shim limits and no priority)."""
    resources = container.get("resources") or {}
    names = _named(resources, lambda name: name.startswith(HAMI_MIG_PREFIX))
    if not names:
        return None
    shares = _named(resources, lambda name: name in HAMI_RESOURCES or name == HAMI_PRIORITY)
    if shares:
        raise Refusal(
            f"{where}: {quote(names[0])} and {shares[0]} are both asked; a container gets MIG "
            "instances or a GPU share, not both."
        )
    if len(names) > 1:
        raise Refusal(
            f"{where}: {quote(names[0])} and {quote(names[1])} are both asked; ask one MIG profile."
        )
    profile = names[0][len(HAMI_MIG_PREFIX) :]
    if not _MIG_PROFILE.match(profile):
        raise Refusal(f"{where}: {quote(names[0])} does not name a MIG profile such as 1g.10gb.")
    return MigRequest(profile=profile, count=_read(where, resources, names[0]) or 1)


def _priority(where: str, resources: Mapping[str, Any]) -> int:
    """``nvidia.com/priority`` (limits, else requests; equal if both): 0 or 1, default 1."""
    values = []
    for section in ("limits", "requests"):
        raw = (resources.get(section) or {}).get(HAMI_PRIORITY)
        if raw is None:
            continue
        try:
            value = parse_quantity(raw)
        except ValueError as error:
            raise Refusal(f"{where}: {HAMI_PRIORITY} is refused: {error}") from None
        if value not in (0, 1):
            raise Refusal(f"{where}: {HAMI_PRIORITY} is {quote(raw)}; it must be 0 (high) or 1 (low).")
        values.append(int(value))
    if len(set(values)) > 1:
        raise Refusal(f"{where}: {HAMI_PRIORITY} has a request and a limit that differ; they must be equal.")
    return values[0] if values else DEFAULT_PRIORITY


def disable_control(container: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The container's last ``CUDA_DISABLE_CONTROL`` env entry (the last wins, as in Kubernetes),
    None when it has none."""
    found = None
    env = container.get("env")
    for entry in env if isinstance(env, list) else []:
        if isinstance(entry, Mapping) and entry.get("name") == HAMI_DISABLE_CONTROL:
            found = entry
    return found


def disables_control(container: Mapping[str, Any]) -> bool:
    """Whether the container asks for HAMi's opt-out: ``CUDA_DISABLE_CONTROL`` is literally ``true``
    (any case), the one value HAMi-core reads as off."""
    value = (disable_control(container) or {}).get("value")
    return isinstance(value, str) and value.lower() == "true"


def mentions_gpu(container: Mapping[str, Any]) -> bool:
    """Whether the container names any of the four HAMi resources in its requests or limits."""
    resources = container.get("resources") or {}
    return any(
        name in (resources.get("limits") or {}) or name in (resources.get("requests") or {})
        for name in HAMI_RESOURCES
    )


def read_request(
    where: str, container: Mapping[str, Any], selection: Selection | None = None
) -> GpuRequest | None:
    """The container's GPU request with defaults applied (on the GPUs ``selection`` admits), None if
    it names none of the resources or asks MIG instances instead (:func:`read_mig`); raises Refusal
    for values no GPU could ever satisfy on their own (fleet-independent rules)."""
    resources = container.get("resources") or {}
    if read_mig(where, container) is not None:
        return None
    if not mentions_gpu(container):
        if _named(resources, lambda name: name == HAMI_PRIORITY):
            raise Refusal(f"{where}: {HAMI_PRIORITY} is given without a GPU; ask {HAMI_GPU} too.")
        return None
    count = _read(where, resources, HAMI_GPU)
    memory = _read(where, resources, HAMI_GPUMEM)
    percent = _read(where, resources, HAMI_GPUMEM_PERCENTAGE)
    cores = _read(where, resources, HAMI_GPUCORES)
    if memory is not None and percent is not None:
        raise Refusal(
            f"{where}: {HAMI_GPUMEM} and {HAMI_GPUMEM_PERCENTAGE} are both given; ask for one of them."
        )
    if percent is not None and percent > 100:
        raise Refusal(f"{where}: {HAMI_GPUMEM_PERCENTAGE} is {percent}; it must be between 1 and 100.")
    if cores is not None and cores > 100:
        raise Refusal(f"{where}: {HAMI_GPUCORES} is {cores}; it must be between 1 and 100.")
    priority = _priority(where, resources)
    enforce = not disables_control(container)
    if not enforce:  # no limits, so nothing less than the whole GPU may be promised to neighbours
        memory, percent, cores = None, DEFAULT_MEMORY_PERCENT, WHOLE_GPU_CORES
    if memory is None and percent is None:
        percent = DEFAULT_MEMORY_PERCENT
    return GpuRequest(
        count=count or 1,
        memory=memory * MiB if memory is not None else None,
        memory_percent=percent,
        cores=cores,
        selection=selection or Selection(),
        priority=priority,
        enforce=enforce,
    )


CONTAINER_LISTS = (("initContainers", "init container"), ("containers", "container"))
"""The pod spec's container lists that can ask for a GPU, with how a message names their members."""


ContainerRequest = tuple[str, int, Mapping[str, Any], str, GpuRequest]


def containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, int, Mapping[str, Any], str]]:
    """Every container and init container of a pod spec: (list name, index, container, how
    messages name it)."""
    for list_name, label in CONTAINER_LISTS:
        for index, container in enumerate(spec.get(list_name) or []):
            yield list_name, index, container, f"{label} {quote(container.get('name', index))}"


def container_requests(
    spec: Mapping[str, Any], selection: Selection | None = None
) -> Iterator[ContainerRequest]:
    """Every container of a pod spec that asks for a GPU share: (list name, index, container, how
    messages name it, its request on the GPUs ``selection`` admits). The webhook converts these; the
    admission check sizes Jobs' pods by them (MIG instances it does not count). Raises Refusal as
    :func:`read_request` does."""
    for list_name, index, container, where in containers(spec):
        request = read_request(where, container, selection)
        if request is not None:
            yield list_name, index, container, where, request


# -- the annotation --------------------------------------------------------------------------------

RECORD_VERSION = 1

MAX_RECORD_LENGTH = 65536
"""Longest annotation value read: four selection lists of at most 2048 characters each, every one
escaped by JSON at most sixfold, fit well within it."""

MAX_COUNT = 1024
MAX_MEMORY = 1 << 50
"""Bounds of a recorded count and of a recorded memory in bytes (a PiB: no GPU comes near)."""

_SELECTION_KEYS = (
    ("use_uuids", "useUuids"),
    ("nouse_uuids", "nouseUuids"),
    ("use_types", "useTypes"),
    ("nouse_types", "nouseTypes"),
)
_KEYS = {"version", "count", "memory", "memoryPercent", "memorySizes", "cores", "priority", "enforcement"} | {
    key for _, key in _SELECTION_KEYS
}


def request_to_annotation(request: GpuRequest) -> str:
    """``request`` as the annotation's JSON; raises RecordError for a request that
    :func:`request_from_annotation` would not read back as the same (the writer checks with the reader,
    so the pair cannot disagree)."""
    record: dict[str, Any] = {"version": RECORD_VERSION, "count": request.count}
    if request.memory is not None:
        record["memory"] = request.memory
    if request.memory_percent is not None:
        record["memoryPercent"] = request.memory_percent
    if request.memory_sizes:
        record["memorySizes"] = list(request.memory_sizes)
    if request.cores is not None:
        record["cores"] = request.cores
    if request.priority != DEFAULT_PRIORITY:
        record["priority"] = request.priority
    if not request.enforce:
        record["enforcement"] = "off"
    for name, key in _SELECTION_KEYS:
        entries = getattr(request.selection, name)
        if entries is not None:
            record[key] = list(entries)
    text = json.dumps(record, separators=(",", ":"))
    if request_from_annotation(text) != request:
        raise RecordError(f"annotation {GPU_REQUEST_ANNOTATION} cannot record {request}.")
    return text


def _fail(problem: str) -> RecordError:
    return RecordError(f"annotation {GPU_REQUEST_ANNOTATION} {problem}.")


def _number(record: Mapping[str, Any], key: str, low: int, high: int) -> int | None:
    value = record.get(key)
    if value is None:
        return None
    if type(value) is not int or not low <= value <= high:
        raise _fail(f"has {key} {quote(value)}, which is not a whole number from {low} to {high}")
    return value


def _entries(record: Mapping[str, Any], key: str, uuids: bool) -> tuple[str, ...] | None:
    value = record.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise _fail(f"has {key} that is not a non-empty list")
    for entry in value:
        if not isinstance(entry, str) or not entry or len(entry) > MAX_ANNOTATION_LENGTH:
            raise _fail(
                f"has an entry of {key} that is not a string of 1 to {MAX_ANNOTATION_LENGTH} characters"
            )
        if (uuids and not _UUID.match(entry)) or (not uuids and entry != entry.lower()):
            raise _fail(
                f"has {quote(entry)} in {key}, which is not a {'GPU UUID' if uuids else 'lower-case type'}"
            )
    if len(set(value)) != len(value):
        raise _fail(f"has {key} with an entry twice")
    return tuple(value)


def request_from_annotation(text: str) -> GpuRequest:
    """The GPU request an annotation value records; raises RecordError, with one sentence, for
    anything but a version-1 record within bounds with exactly the known fields."""
    if len(text) > MAX_RECORD_LENGTH:
        raise _fail(f"is longer than {MAX_RECORD_LENGTH} characters")
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):
        raise _fail("is not JSON") from None
    if not isinstance(record, dict):
        raise _fail("is not a JSON object")
    if record.get("version") != RECORD_VERSION or type(record.get("version")) is not int:
        raise _fail(
            f"has version {quote(record.get('version'))}; this Tessera reads version {RECORD_VERSION}"
        )
    unknown = sorted(set(record) - _KEYS)
    if unknown:
        raise _fail(f"has the unknown field {quote(unknown[0])}")
    count = _number(record, "count", 1, MAX_COUNT)
    if count is None:
        raise _fail("has no count")
    memory = _number(record, "memory", 1, MAX_MEMORY)
    percent = _number(record, "memoryPercent", 1, 100)
    if (memory is None) == (percent is None):
        raise _fail("must have exactly one of memory and memoryPercent")
    sizes = record.get("memorySizes")
    if sizes is not None:
        if percent is None or not isinstance(sizes, list) or not 1 <= len(sizes) <= MAX_MEMORY_SIZES:
            raise _fail(f"has memorySizes that are not 1 to {MAX_MEMORY_SIZES} sizes of a memoryPercent")
        for size in sizes:
            if type(size) is not int or not 1 <= size <= MAX_MEMORY:
                raise _fail(
                    f"has the memory size {quote(size)}, which is not a whole number from 1 to {MAX_MEMORY}"
                )
    selection = Selection(**{name: _entries(record, key, "uuid" in name) for name, key in _SELECTION_KEYS})
    priority = _number(record, "priority", 0, 1)
    if record.get("enforcement", "off") != "off":
        raise _fail(f'has enforcement {quote(record["enforcement"])}; only "off" is recorded')
    return GpuRequest(
        count=count,
        memory=memory,
        memory_percent=percent,
        cores=_number(record, "cores", 1, 100),
        selection=selection,
        memory_sizes=tuple(sizes or ()),
        priority=DEFAULT_PRIORITY if priority is None else priority,
        enforce="enforcement" not in record,
    )
