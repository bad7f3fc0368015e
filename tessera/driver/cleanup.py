"""Prepared claims the API no longer has: found and unprepared, periodically and after a lost state.

The kubelet unprepares what it knows; what it cannot know about — a claim deleted while the daemon
was down, a prepare that was cut short, folders left after the checkpoint was lost or the node
rebooted — is this module's. A checkpointed or on-host claim whose ResourceClaim is gone, has another
UID, or is no longer allocated to this node is unprepared. After a checkpoint loss or a reboot, a
claim that still exists and is allocated here is prepared again from the API.

Each claim is looked up through the claim cache (tessera/driver/claims.py): one the node's watch holds
costs nothing, and only one it does not hold (gone, most likely, or not seen yet) costs a GET. So a
sweep of a node whose claims are all alive makes no API call, where it used to make one per claim.
"""

from __future__ import annotations

import logging
import threading

from tessera.driver.allocation import AllocationError
from tessera.driver.claims import ClaimCache, ClaimNotFound
from tessera.driver.config import DriverConfig
from tessera.driver.state import DeviceState, claim_identity

log = logging.getLogger(__name__)


def sweep(config: DriverConfig, state: DeviceState, claims: ClaimCache, reprepare: bool = False) -> int:
    """One pass; returns how many claims were unprepared. With ``reprepare``, claims still in the
    API are prepared again (rebuilding a lost or outdated checkpoint)."""
    records = state.records()
    identities: dict[str, tuple[str, str]] = {uid: (r.namespace, r.name) for uid, r in records.items()}
    for uid in state.devices_on_host() - set(identities):
        identity = claim_identity(config, uid)
        if identity is None:
            log.warning("claim folder or CDI spec %s has no readable identity; removing it", uid)
            state.unprepare(uid)
            continue
        identities[uid] = (identity[0], identity[1])
    removed = 0
    for uid, (namespace, name) in sorted(identities.items()):
        try:
            claim = claims.get(namespace, name, uid)
        except ClaimNotFound:
            log.info("ResourceClaim %s/%s (%s) is gone; unpreparing it", namespace, name, uid)
            state.unprepare(uid)
            removed += 1
            continue
        if reprepare:
            try:
                state.prepare(claim)
            except AllocationError as error:
                log.info("ResourceClaim %s/%s is no longer ours (%s); unpreparing it", namespace, name, error)
                state.unprepare(uid)
                removed += 1
    return removed


def sweep_forever(
    config: DriverConfig, state: DeviceState, claims: ClaimCache, interval: float, stop: threading.Event
) -> None:
    while not stop.wait(interval):
        try:
            sweep(config, state, claims)
        except Exception:
            log.exception("clean-up of stale claims failed; retrying in %.0fs", interval)
