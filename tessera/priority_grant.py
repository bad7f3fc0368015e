"""Who may run at priority 0 (high): only pods in namespaces an administrator lists in the chart
value ``webhook.highPriorityNamespaces``; pure.

A high-priority share holds every low-priority neighbour on its GPU back while it has kernels in
flight (docs/shim.md, "Priority"), so asking for it is taking compute from other tenants. The
webhook refuses it early, with a sentence, for pods written for HAMi; the node daemon refuses it
again at prepare, for claims written by hand, which never pass the webhook. Both read the same list
from the chart, and both say who grants it in the same words, here.
"""

from __future__ import annotations

from collections.abc import Collection

HIGH_PRIORITY = 0
"""HAMi's high task priority; 1, the default, is low."""

CHART_VALUE = "webhook.highPriorityNamespaces"
"""The chart value that lists the namespaces allowed priority 0 (the webhook's
``--high-priority-namespaces`` and the node daemon's ``--high-priority-namespace``)."""


def granted(namespace: str, allowed: Collection[str]) -> bool:
    """Whether a share in ``namespace`` may run at priority 0."""
    return namespace in allowed


def refusal(namespace: str) -> str:
    """The end of the sentence that refuses priority 0 to a share in ``namespace``: the caller
    names what asked for it first ('container "main": nvidia.com/priority 0 (high) ...'). It says
    who grants priority 0 and names the namespace, and ends without a full stop, since the node
    daemon's sentences have none."""
    return (
        f"is granted only to namespaces an administrator lists in the chart value {CHART_VALUE}, "
        f'and namespace "{namespace}" is not listed'
    )
