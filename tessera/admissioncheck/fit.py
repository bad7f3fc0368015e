"""Do these pods' GPU shares fit, all at once, on the GPUs' free capacity? A real packing; pure.

The model is the scheduler's (DRA consumable capacity on ``allowMultipleAllocations`` devices):

- a pod's shares all land on one node, since a pod runs on one node;
- each share takes ``memory`` and ``cores`` from one GPU; shares of different requests (a pod's
  containers, or a claim's requests) may land on the same GPU as long as its free capacity holds them,
  but the ``count`` shares of one request go to ``count`` different GPUs: the scheduler picks a
  request's devices in order, each after the one before, and the webhook's claims say so too with a
  distinct-UUID constraint (``nvidia.com/gpu: 2`` is two GPUs, as in HAMi);
- a request with ``firstAvailable`` choices takes all its ``count`` shares from the first choice
  that can be met (a percentage is a choice per GPU memory size, as the webhook writes it).

Packing shares onto GPUs is bin packing, so a sum that fits says nothing (four shares of 20Gi do not
fit on four GPUs with 12Gi free each, nor two 15Gi shares on GPUs with 20Gi and 10Gi free). This
module first tries each group whole on one node (a PodSet on one node can be held there), then
searches: pods largest first, nodes and GPUs best fit first, backtracking over distinct
choices only (GPUs or nodes in the same state are tried once), within a step budget. A packing it
returns is a real assignment of every share to a GPU; "does not fit" is exact unless ``exhausted``
says the budget ran out first.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from tessera.gpu_request import Selection, share_of
from tessera.quantity import GiB, MiB
from tessera.slices import GpuKey, PublishedGpu

DEFAULT_BUDGET = 20_000
"""Share placements tried before the search gives up (each is a few microseconds)."""

_QUICK_STEPS = 200
"""Steps of the first, short search (see :func:`pack`)."""


@dataclass(frozen=True)
class Choice:
    """One way to meet a share: absolute ``memory`` (bytes) or ``memory_percent`` of the GPU's,
    ``cores`` (0: not capped, takes none), on GPUs the selection admits (and, for a percentage
    subrequest, only those of exactly ``memory_size``)."""

    memory: int | None = None
    memory_percent: int | None = None
    cores: int = 0
    selection: Selection = field(default_factory=Selection)
    memory_size: int | None = None

    def matches(self, gpu: PublishedGpu) -> bool:
        if self.memory_size is not None and gpu.memory != self.memory_size:
            return False
        return self.selection.matches(gpu.uuid, gpu.product)

    def memory_on(self, gpu: PublishedGpu) -> int:
        if self.memory is not None:
            return self.memory
        return share_of(gpu.memory, self.memory_percent or 0)


@dataclass(frozen=True)
class Request:
    """``count`` shares, all met by the first of ``choices`` that can be met."""

    count: int
    choices: tuple[Choice, ...]


@dataclass(frozen=True)
class PodGroup:
    """``count`` identical pods (a Kueue PodSet), each needing every one of ``requests``."""

    name: str
    count: int
    requests: tuple[Request, ...]

    @property
    def shares_per_pod(self) -> int:
        return sum(r.count for r in self.requests)


@dataclass(frozen=True)
class Placement:
    """Where one pod of ``group`` goes: its node and (GPU, memory, cores) per share."""

    group: str
    node: str
    shares: tuple[tuple[GpuKey, int, int], ...]


@dataclass
class Packing:
    """The outcome of :func:`pack`: placements when everything fits, else None; ``exhausted``
    when the search stopped at its budget rather than proving there is no packing."""

    placements: list[Placement] | None
    exhausted: bool = False
    steps: int = 0
    waits_for: str | None = None
    """A node that holds it all but was to be avoided (see ``avoid`` of :func:`pack`)."""
    whole_groups: bool = False
    """Whether every group is whole on one node, placed by :func:`first_fit`: a plan the scheduler
    reproduces once the pods are held to their nodes."""

    @property
    def fits(self) -> bool:
        return self.placements is not None


Free = dict[GpuKey, tuple[int, int]]
"""Free (memory, cores) per GPU."""


def free_capacity(gpus: Sequence[PublishedGpu], used: Mapping[GpuKey, tuple[int, int]]) -> Free:
    """Each GPU's capacity minus what ``used`` says is taken (allocated claims); never below 0."""
    out: Free = {}
    for gpu in gpus:
        memory, cores = used.get(gpu.key, (0, 0))
        out[gpu.key] = (max(gpu.memory - memory, 0), max(gpu.cores - cores, 0))
    return out


def apply(free: Free, placements: Sequence[Placement]) -> Free:
    """``free`` less what ``placements`` take (a new mapping)."""
    out = dict(free)
    for placement in placements:
        for key, memory, cores in placement.shares:
            m, c = out[key]
            out[key] = (m - memory, c - cores)
    return out


@dataclass(frozen=True)
class _NodeSummary:
    state: tuple[tuple[object, ...], ...]
    total_memory: int
    max_memory: int
    max_cores: int


def _pod_floor(group: PodGroup) -> tuple[int, int, int]:
    """What any node must have to hold one pod: (largest share's memory, all shares' memory, largest
    share's cores), counting only absolute memory (a percentage depends on the GPU)."""
    largest = total = cores = 0
    for request in group.requests:
        memory = (
            min((c.memory if c.memory is not None else 0) for c in request.choices) if request.choices else 0
        )
        core = min(c.cores for c in request.choices) if request.choices else 0
        largest, cores = max(largest, memory), max(cores, core)
        total += memory * request.count
    return largest, total, cores


class _Search:
    """Depth-first search over pods (iterative: a plan may hold thousands of pods), each pod over
    nodes (best fit first, one per distinct state) and layouts on the node."""

    def __init__(
        self,
        gpus: Sequence[PublishedGpu],
        free: Free,
        budget: int,
        by_uuid: bool,
        known: SummaryCache | None = None,
    ) -> None:
        self.nodes: dict[str, list[PublishedGpu]] = {}
        for gpu in gpus:
            self.nodes.setdefault(gpu.node, []).append(gpu)
        self.node_index = {node: i for i, node in enumerate(self.nodes)}
        self.free = dict(free)
        self.budget = budget
        self.steps = 0
        self.exhausted = False
        self.by_uuid = by_uuid
        # Node summaries of ``free`` computed by earlier searches on the same free capacity.
        self._summaries: dict[str, _NodeSummary] = dict(known.get(by_uuid, {})) if known is not None else {}

    def _gpu_state(self, gpu: PublishedGpu) -> tuple[object, ...]:
        """What makes two GPUs interchangeable for every share of this search."""
        memory, cores = self.free[gpu.key]
        return (memory, cores, gpu.memory, gpu.product, gpu.uuid if self.by_uuid else "")

    def _summary(self, node: str) -> _NodeSummary:
        summary = self._summaries.get(node)
        if summary is None:
            gpus = self.nodes[node]
            frees = [self.free[g.key] for g in gpus]
            summary = _NodeSummary(
                state=tuple(sorted(self._gpu_state(g) for g in gpus)),
                total_memory=sum(m for m, _ in frees),
                max_memory=max(m for m, _ in frees),
                max_cores=max(c for _, c in frees),
            )
            self._summaries[node] = summary
        return summary

    def _set_free(self, gpu: PublishedGpu, value: tuple[int, int]) -> None:
        self.free[gpu.key] = value
        self._summaries.pop(gpu.node, None)

    def _node_order(self, group: PodGroup, min_index: int) -> list[str]:
        """Nodes that could hold one pod on their free totals, least free memory first (best fit),
        one per distinct state, none before ``min_index`` (identical pods go in node order)."""
        largest, total, cores = _pod_floor(group)
        # A request's shares take as many GPUs of one node as its count.
        widest = max((r.count for r in group.requests), default=0)
        seen: set[tuple[tuple[object, ...], ...]] = set()
        candidates = []
        for node, index in self.node_index.items():
            if index < min_index or len(self.nodes[node]) < widest:
                continue
            summary = self._summary(node)
            if summary.max_memory < largest or summary.total_memory < total or summary.max_cores < cores:
                continue
            if summary.state in seen:
                continue
            seen.add(summary.state)
            candidates.append((summary.total_memory, index, node))
        candidates.sort()
        return [node for _, _, node in candidates]

    def _place_shares(
        self, node: str, shares: list[tuple[int, Choice]], index: int, taken: list[tuple[GpuKey, int, int]]
    ) -> Iterator[None]:
        """Yield once per distinct way of placing shares[index:] on ``node`` (each a request's index
        in the pod and its choice; shares of one request on different GPUs); the state is applied
        while the caller runs and undone when the generator moves on."""
        if index == len(shares):
            yield
            return
        request, choice = shares[index]
        same_request = {taken[i][0] for i in range(index) if shares[i][0] == request}
        seen: set[tuple[object, ...]] = set()
        options = []
        for gpu in self.nodes[node]:
            if gpu.key in same_request or not choice.matches(gpu):
                continue
            free_memory, free_cores = self.free[gpu.key]
            need = choice.memory_on(gpu)
            if need > free_memory or choice.cores > free_cores:
                continue
            state = self._gpu_state(gpu)
            if state in seen:
                continue
            seen.add(state)
            options.append((free_memory - need, free_cores - choice.cores, gpu, need))
        options.sort(key=lambda o: (o[0], o[1]))
        for _, _, gpu, need in options:
            self.steps += 1
            if self.steps > self.budget:
                self.exhausted = True
                return
            memory, cores = self.free[gpu.key]
            self._set_free(gpu, (memory - need, cores - choice.cores))
            taken.append((gpu.key, need, choice.cores))
            yield from self._place_shares(node, shares, index + 1, taken)
            taken.pop()
            self._set_free(gpu, (memory, cores))
            if self.exhausted:
                return

    def _pod_layouts(self, node: str, group: PodGroup) -> Iterator[tuple[tuple[GpuKey, int, int], ...]]:
        """Every distinct placement of one pod of ``group`` on ``node``, trying each request's
        choices in order (all of a request's shares from one choice)."""

        def expand(r: int, prefix: list[tuple[int, Choice]]) -> Iterator[list[tuple[int, Choice]]]:
            if r == len(group.requests):
                yield prefix
                return
            request = group.requests[r]
            for choice in request.choices:
                yield from expand(r + 1, prefix + [(r, choice)] * request.count)

        for shares in expand(0, []):
            taken: list[tuple[GpuKey, int, int]] = []
            for _ in self._place_shares(node, shares, 0, taken):
                yield tuple(taken)
            if self.exhausted:
                return

    def _options(self, group: PodGroup, min_index: int) -> Iterator[Placement]:
        """Every placement of one pod of ``group`` (applied while the caller looks at it)."""
        if group.shares_per_pod == 0:
            yield Placement(group.name, "", ())
            return
        for node in self._node_order(group, min_index):
            for layout in self._pod_layouts(node, group):
                yield Placement(group.name, node, layout)
            if self.exhausted:
                return

    def run(self, pods: list[PodGroup]) -> list[Placement] | None:
        if not pods:
            return []
        out: list[Placement] = []
        stack = [self._options(pods[0], 0)]
        while stack:
            level = len(stack) - 1
            placement = next(stack[-1], None)
            if level < len(out):
                out.pop()  # the previous option of this level has been undone by next()
            if placement is None:
                stack.pop()
                if self.exhausted:
                    return None
                continue
            out.append(placement)
            if len(out) == len(pods):
                return out
            following = pods[level + 1]
            same = following.name == pods[level].name and following.requests == pods[level].requests
            min_index = self.node_index.get(placement.node, 0) if same else 0
            stack.append(self._options(following, min_index))
        return None


def _largest_need(group: PodGroup, biggest_gpu: int) -> tuple[int, int]:
    memory = 0
    cores = 0
    for request in group.requests:
        for choice in request.choices:
            m = (
                choice.memory
                if choice.memory is not None
                else biggest_gpu * (choice.memory_percent or 0) // 100
            )
            memory += m * request.count
            cores += choice.cores * request.count
            break
    return memory, cores


def _too_few_slots(groups: Sequence[PodGroup], gpus: Sequence[PublishedGpu], free: Free) -> bool:
    """A necessary condition, checked before searching: every request with one choice needs as many
    places for its shares as the group has pods times its count, counting each GPU's free memory and
    cores in whole shares, and at most one place per pod on each GPU (a request's shares go to
    different GPUs); and one node with a place on as many GPUs as the count. (For pods of a single
    share it is also sufficient.)"""
    for group in groups:
        for request in group.requests:
            if len(request.choices) != 1 or group.count == 0 or request.count == 0:
                continue
            choice = request.choices[0]
            slots = 0
            wanted = group.count * request.count
            usable: dict[str, int] = {}
            widest = 0
            for gpu in gpus:
                if not choice.matches(gpu):
                    continue
                memory, cores = free[gpu.key]
                need = choice.memory_on(gpu)
                fit = memory // need if need else wanted
                if choice.cores:
                    fit = min(fit, cores // choice.cores)
                if fit > 0:
                    usable[gpu.node] = usable.get(gpu.node, 0) + 1
                    widest = max(widest, usable[gpu.node])
                slots += min(fit, group.count)
                if slots >= wanted and widest >= request.count:
                    break
            if slots < wanted or widest < request.count:
                return True
    return False


def first_fit(group: PodGroup, node_gpus: Sequence[PublishedGpu], free: Free) -> list[Placement] | None:
    """Where the scheduler's allocator puts the group's pods on one node, one pod after another:
    each request on its first choice that can be met, each share on the first GPU in the slice's
    order with room, a request's shares on different GPUs. None when a pod would not fit. This is
    the scheduler's own rule on a node (it does not search), so a plan made with it is one the
    scheduler reproduces when the pods arrive in the order planned."""
    free = dict(free)
    out: list[Placement] = []
    for _ in range(group.count):
        taken: list[tuple[GpuKey, int, int]] = []
        for request in group.requests:
            for choice in request.choices:
                chosen: list[tuple[GpuKey, int]] = []
                for gpu in node_gpus:
                    if len(chosen) == request.count:
                        break
                    memory, cores = free[gpu.key]
                    need = choice.memory_on(gpu)
                    if choice.matches(gpu) and need <= memory and choice.cores <= cores:
                        chosen.append((gpu.key, need))
                if len(chosen) == request.count:
                    for key, need in chosen:
                        memory, cores = free[key]
                        free[key] = (memory - need, cores - choice.cores)
                        taken.append((key, need, choice.cores))
                    break
            else:
                return None
        out.append(Placement(group.name, node_gpus[0].node if node_gpus else "", tuple(taken)))
    return out


def _whole_groups_on_single_nodes(
    groups: Sequence[PodGroup],
    gpus: Sequence[PublishedGpu],
    free: Free,
    biggest: int,
    avoid: frozenset[str],
) -> list[Placement] | str | None:
    """Each group's pods all on one node (the best fit that holds them all, largest group first),
    placed there as the scheduler would (:func:`first_fit`), or None when some group fits on no
    single node that way. Tried before the general search because a PodSet on one node can be held
    there (pinning.py), and then the scheduler reproduces the plan: the general search spreads a
    PodSet across nodes whenever best fit says so, and packs GPUs tighter than the scheduler's
    first fit can follow. A node in ``avoid`` that would hold a group is returned instead, by name:
    the caller waits for it rather than spreading the group."""
    by_node: dict[str, list[PublishedGpu]] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node, []).append(gpu)
    free = dict(free)
    out: list[Placement] = []
    ordered = sorted(
        groups, key=lambda g: tuple(x * g.count for x in _largest_need(g, biggest)), reverse=True
    )
    for group in ordered:
        if group.shares_per_pod == 0:
            out.extend(Placement(group.name, "", ()) for _ in range(group.count))
            continue
        need = _pod_floor(group)[1] * group.count
        nodes = sorted(
            (sum(free[g.key][0] for g in node_gpus), node)
            for node, node_gpus in by_node.items()
            if sum(free[g.key][0] for g in node_gpus) >= need
        )
        waits_for = None
        for _, node in nodes:
            placed = first_fit(group, by_node[node], free)
            if placed is not None and node in avoid:
                waits_for = waits_for or node
            elif placed is not None:
                free = apply(free, placed)
                out.extend(placed)
                break
        else:
            return waits_for
    return out


SummaryCache = dict[bool, dict[str, _NodeSummary]]
"""Node summaries of one free-capacity mapping, kept between searches on it by a caller that
invalidates a node's entry (``forget``) whenever it changes that node's free capacity."""


def forget(cache: SummaryCache, nodes: Iterable[str]) -> None:
    for summaries in cache.values():
        for node in nodes:
            summaries.pop(node, None)


def pack(
    groups: Sequence[PodGroup],
    gpus: Sequence[PublishedGpu],
    free: Free,
    budget: int = DEFAULT_BUDGET,
    cache: SummaryCache | None = None,
    avoid: frozenset[str] = frozenset(),
) -> Packing:
    """Place every pod of every group at once on ``free``; see the module docstring. ``cache``
    carries node summaries of ``free`` from one call to the next. A group that one node in
    ``avoid`` would hold whole, and no other node does, is not spread: the packing is None and
    ``waits_for`` names that node."""
    biggest = max((g.memory for g in gpus), default=0)
    pods = [PodGroup(g.name, 1, g.requests) for g in groups for _ in range(g.count)]
    # Largest first; identical pods stay adjacent (stable sort), which the search relies on.
    pods.sort(key=lambda p: _largest_need(p, biggest), reverse=True)
    by_uuid = any(c.selection.names_uuids for g in groups for r in g.requests for c in r.choices)
    whole = _whole_groups_on_single_nodes(groups, gpus, free, biggest, avoid)
    if isinstance(whole, str):
        return Packing(None, waits_for=whole)
    if whole is not None:
        return Packing(whole, whole_groups=True)
    # A short search first: most answers come within it. Only a search that runs long pays for the
    # slot count, which proves most hopeless cases hopeless at once.
    search = _Search(gpus, free, min(budget, _QUICK_STEPS), by_uuid, cache)
    if cache is not None:
        # Fill the cache with the summaries of the unchanged start state (taken before any share
        # is placed), so the next search on the same capacity does not recompute them.
        for node in search.nodes:
            search._summary(node)
        cache[by_uuid] = dict(search._summaries)
    placements = search.run(pods)
    steps = search.steps
    if placements is None and search.exhausted and budget > _QUICK_STEPS:
        if _too_few_slots(groups, gpus, free):
            return Packing(None, steps=steps)
        search = _Search(gpus, free, budget, by_uuid, cache)
        placements = search.run(pods)
        steps += search.steps
    return Packing(placements, exhausted=search.exhausted and placements is None, steps=steps)


# -- saying why ------------------------------------------------------------------------------------


def format_bytes(value: int) -> str:
    """20Gi, 1536Mi, 0: the way a user wrote it."""
    if value == 0:
        return "0"
    if value % GiB == 0:
        return f"{value // GiB}Gi"
    if value % MiB == 0:
        return f"{value // MiB}Mi"
    return str(value)


def _share_text(choice: Choice) -> str:
    memory = format_bytes(choice.memory) if choice.memory is not None else f"{choice.memory_percent}%"
    return f"{memory}/{choice.cores}" if choice.cores else memory


def describe_need(groups: Sequence[PodGroup]) -> str:
    """'4 shares of 20Gi/30' (and '..., 2 shares of 8Gi'): the first choice of each request."""
    counts: dict[str, int] = {}
    for group in groups:
        for request in group.requests:
            if request.choices:
                text = _share_text(request.choices[0])
                counts[text] = counts.get(text, 0) + request.count * group.count
    parts = [f"{n} share{'s' if n != 1 else ''} of {text}" for text, n in counts.items()]
    return ", ".join(parts) if parts else "no GPU"


def largest_free(
    groups: Sequence[PodGroup], gpus: Sequence[PublishedGpu], free: Free
) -> tuple[PublishedGpu, int, int] | None:
    """The GPU with the most free memory among those some share of ``groups`` may use."""
    choices = [c for g in groups for r in g.requests for c in r.choices]
    best: tuple[PublishedGpu, int, int] | None = None
    for gpu in gpus:
        if not any(c.matches(gpu) for c in choices):
            continue
        memory, cores = free[gpu.key]
        if best is None or (memory, cores) > (best[1], best[2]):
            best = (gpu, memory, cores)
    return best


def no_fit_message(
    groups: Sequence[PodGroup], gpus: Sequence[PublishedGpu], free: Free, exhausted: bool
) -> str:
    """'needs 4 shares of 20Gi/30 at once; the largest free share is 12Gi/100 on node-b (gpu-1)';
    where a request asks for more than one share, the need says those go to different GPUs."""
    need = describe_need(groups)
    widest = max((r.count for g in groups for r in g.requests), default=0)
    if widest > 1:
        need += f" at once, a request's {widest} shares on {widest} different GPUs of one node"
    else:
        need += " at once"
    best = largest_free(groups, gpus, free)
    if best is None:
        where = "no published GPU matches its selectors"
    else:
        gpu, memory, cores = best
        where = f"the largest free share is {format_bytes(memory)}/{cores} on {gpu.node} ({gpu.name})"
    suffix = "; no packing was found within the search limit" if exhausted else ""
    return f"needs {need}; {where}{suffix}"
