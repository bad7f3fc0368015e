"""Prepare and unprepare under the checkpoint's two phases: the one place claims change state.

For each claim: compute the shares and devices (pure, repeatable), record ``PrepareStarted``, write
the claim's folder and CDI spec, record ``PrepareCompleted``. A claim already completed with the
same devices is returned as it is; a started one is simply redone (every side effect overwrites
identically), so a kill at any instant converges on the kubelet's retry. Calls for different claims
run in parallel; calls for one claim are serialised by that claim's lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tessera.driver import allocation, cdi, checkpoint, claim_files, share_config
from tessera.driver.checkpoint import PREPARE_COMPLETED, PREPARE_STARTED, ClaimRecord, PreparedDevice
from tessera.driver.config import DriverConfig
from tessera.driver.container_driver import ContainerDriver
from tessera.driver.devices import device, device_name, mig_device_name
from tessera.driver.discovery import Gpu, MigDevice
from tessera.names import MEMORY_CAPACITY
from tessera.shim.format import GpuLimit

log = logging.getLogger(__name__)

PREPARE_STEPS = ("before-checkpoint", "after-checkpoint", "after-cdi")
"""The points of a prepare where a crash leaves different state behind: nothing recorded yet;
PrepareStarted recorded, nothing written; the CDI spec written, PrepareCompleted not yet recorded.
:meth:`DeviceState.reached` is called at each; the crash tests stop the daemon there."""


@dataclass
class _ClaimLock:
    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0


class DeviceState:
    def __init__(
        self, config: DriverConfig, gpus: Sequence[Gpu], container_driver: ContainerDriver, boot_id: str
    ) -> None:
        self._config = config
        self._gpus: dict[str, Gpu] = {}
        self._migs: dict[str, tuple[Gpu, MigDevice]] = {}
        self._gpus_lock = threading.Lock()
        self.set_gpus(gpus)
        self._driver = container_driver
        self._claim_locks: dict[str, _ClaimLock] = {}
        self._locks_guard = threading.Lock()
        self._checkpoint_lock = threading.Lock()
        loaded = checkpoint.load(config.checkpoint_file, boot_id)
        self._checkpoint = loaded.checkpoint
        self.rebuild_reason = loaded.rebuild
        """Set when the prepared state must be rebuilt from the API and the host (see cleanup)."""

    def set_gpus(self, gpus: Sequence[Gpu]) -> None:
        """The GPUs as published now: shareable ones by device name, and the MIG instances of those
        in MIG mode (a mode switch while the daemon runs changes which)."""
        shared = {device_name(g): g for g in gpus if not g.mig_enabled}
        migs = {mig_device_name(m): (g, m) for g in gpus if g.mig_enabled for m in g.mig_devices}
        with self._gpus_lock:
            self._gpus, self._migs = shared, migs

    # ------------------------------------------------------------------ queries

    def records(self) -> dict[str, ClaimRecord]:
        with self._checkpoint_lock:
            return dict(self._checkpoint.claims)

    def devices_on_host(self) -> set[str]:
        """Claim UIDs with a folder or a CDI spec on the host, recorded or not."""
        return set(claim_files.claim_uids(self._config.claims_dir)) | set(
            cdi.claim_uids(self._config.cdi_dir)
        )

    # ------------------------------------------------------------------ prepare

    def reached(self, step: str) -> None:
        """A prepare got to ``step`` (one of :data:`PREPARE_STEPS`). Does nothing: the test bed's
        crashing daemon (testbed/crashing_driver.py) replaces it to die there, so production code
        carries no fault switch."""

    def prepare(self, claim: Mapping[str, Any]) -> list[PreparedDevice]:
        """Prepare ``claim`` (a ResourceClaim as JSON, allocated); raise AllocationError or
        OSError with a one-sentence reason."""
        meta = claim["metadata"]
        uid, namespace, name = meta["uid"], meta["namespace"], meta["name"]
        with self._gpus_lock:
            gpus, migs = self._gpus, self._migs
        shares = allocation.shares(
            claim, self._config.driver_name, self._config.pool_name, [*gpus, *migs], exclusive=migs
        )
        mig_shares = [s for s in shares if s.device in migs]
        if mig_shares and len(mig_shares) != len(shares):
            raise allocation.AllocationError(
                f"ResourceClaim {allocation.claim_ref(claim)} holds both MIG instances and GPU shares; "
                "ask for them in separate claims (a container on a MIG instance runs without the shim "
                "that shares need)"
            )
        if mig_shares:
            return self._prepare_mig(uid, namespace, name, [migs[s.device] for s in shares], shares)
        capacity = {
            gpu_name: int(device(gpu)["capacity"][MEMORY_CAPACITY]["value"]) for gpu_name, gpu in gpus.items()
        }
        settings = share_config.settings(
            claim, self._config.driver_name, shares, capacity, self._config.high_priority_namespaces
        )
        devices = self._devices(uid, shares, gpus)
        if not self._in_two_phases(
            uid,
            namespace,
            name,
            devices,
            lambda: self._write_side_effects(uid, namespace, name, shares, gpus, settings),
        ):
            return devices
        log.info(
            "prepared claim %s/%s (%s): %s",
            namespace,
            name,
            uid,
            ", ".join(
                f"{s.device} memory={s.memory_bytes} cores={s.cores} share={s.share_id} "
                f"priority={settings.priorities[s.device]}"
                for s in shares
            )
            + ("" if settings.enforced else "; enforcement off (whole GPUs, no shim)"),
        )
        return devices

    def _prepare_mig(
        self,
        uid: str,
        namespace: str,
        name: str,
        instances: Sequence[tuple[Gpu, MigDevice]],
        shares: Sequence[allocation.Share],
    ) -> list[PreparedDevice]:
        """A claim of whole MIG instances: the container gets exactly those instances and the
        driver, and no shim, limits or usage region (the hardware isolates it)."""
        cdi_devices = [
            cdi.CdiDevice(
                cdi.device_name(uid, share.device, None),
                mig.uuid,
                self._driver.mig_device_nodes(gpu.minor_number, mig.gpu_instance_id, mig.compute_instance_id),
            )
            for share, (gpu, mig) in zip(shares, instances, strict=True)
        ]
        devices = [
            PreparedDevice(
                request_names=(share.request,),
                pool=share.pool,
                device=share.device,
                cdi_device_ids=(ours.qualified_name, *self._driver.toolkit_ids([ours.gpu_uuid])),
                share_id=None,
            )
            for share, ours in zip(shares, cdi_devices, strict=True)
        ]

        def write() -> None:
            claim_files.write_identity(
                claim_files.claim_files(self._config.claims_dir, uid), namespace, name, uid
            )
            spec = cdi.mig_spec(
                cdi_devices,
                self._driver.loader_libraries,
                self._driver.common_device_nodes,
                self._config.container_env,
                self._config.container_mounts,
            )
            cdi.write(self._config.cdi_dir, uid, spec)

        if not self._in_two_phases(uid, namespace, name, devices, write):
            return devices
        log.info(
            "prepared claim %s/%s (%s): MIG instances %s",
            namespace,
            name,
            uid,
            ", ".join(
                f"{s.device} ({mig.profile}, {mig.uuid})"
                for s, (_, mig) in zip(shares, instances, strict=True)
            ),
        )
        return devices

    def _in_two_phases(
        self, uid: str, namespace: str, name: str, devices: list[PreparedDevice], write: Callable[[], None]
    ) -> bool:
        """Record PrepareStarted, ``write`` the side effects, record PrepareCompleted, under the claim's
        lock; False (nothing done) when the claim is already completed with the same devices."""
        with self._claim_lock(uid):
            record = self.records().get(uid)
            if record is not None and record.state == PREPARE_COMPLETED and list(record.devices) == devices:
                return False
            self.reached("before-checkpoint")
            self._record(ClaimRecord(uid, namespace, name, PREPARE_STARTED, tuple(devices)))
            self.reached("after-checkpoint")
            write()
            self.reached("after-cdi")
            self._record(ClaimRecord(uid, namespace, name, PREPARE_COMPLETED, tuple(devices)))
        return True

    def _devices(
        self, uid: str, shares: Sequence[allocation.Share], gpus: Mapping[str, Gpu]
    ) -> list[PreparedDevice]:
        out = []
        for share in shares:
            gpu = gpus[share.device]
            ours = cdi.CdiDevice(cdi.device_name(uid, share.device, share.share_id), gpu.uuid)
            out.append(
                PreparedDevice(
                    request_names=(share.request,),
                    pool=share.pool,
                    device=share.device,
                    cdi_device_ids=(ours.qualified_name, *self._driver.toolkit_ids([gpu.uuid])),
                    share_id=share.share_id,
                )
            )
        return out

    def _write_side_effects(
        self,
        uid: str,
        namespace: str,
        name: str,
        shares: Sequence[allocation.Share],
        gpus: Mapping[str, Gpu],
        settings: share_config.ClaimSettings,
    ) -> None:
        files = claim_files.claim_files(self._config.claims_dir, uid)
        limits = [
            GpuLimit(gpus[g.device].uuid, g.memory_bytes, g.cores, settings.priorities[g.device])
            for g in allocation.limits(shares)
        ]
        boards = (
            [
                (claim_files.board(self._config.state_dir, g.uuid), g.priority == share_config.PRIORITY_HIGH)
                for g in limits
            ]
            if settings.enforced
            else []
        )
        claim_files.write(
            files,
            namespace,
            name,
            uid,
            limits,
            self._driver.container_cuda,
            self._driver.container_nvml,
            enforced=settings.enforced,
            nested=[
                *(claim_files.CONTAINER_BOARDS / board.name for board, _ in boards),
                *(p for p in self._driver.libraries if p.is_relative_to(claim_files.CONTAINER_DIR)),
            ],
        )
        cdi_devices = [
            cdi.CdiDevice(
                cdi.device_name(uid, s.device, s.share_id),
                gpus[s.device].uuid,
                self._driver.gpu_device_nodes(gpus[s.device].minor_number),
            )
            for s in shares
        ]
        spec = cdi.spec(
            cdi_devices,
            files,
            [limit.uuid for limit in limits],
            self._driver.libraries,
            self._driver.common_device_nodes,
            self._config.container_env,
            self._config.container_mounts,
            boards,
            enforced=settings.enforced,
        )
        cdi.write(self._config.cdi_dir, uid, spec)

    # ------------------------------------------------------------------ unprepare

    def unprepare(self, uid: str) -> bool:
        """Remove what prepare made for ``uid``. Unknown claims succeed. Returns whether anything
        was recorded or on the host."""
        with self._claim_lock(uid):
            known = uid in self.records()
            on_host = uid in self.devices_on_host()
            cdi.remove(self._config.cdi_dir, uid)
            claim_files.remove(claim_files.claim_files(self._config.claims_dir, uid))
            if known:
                with self._checkpoint_lock:
                    self._checkpoint.claims.pop(uid, None)
                    checkpoint.save(self._config.checkpoint_file, self._checkpoint)
        if known or on_host:
            log.info("unprepared claim %s", uid)
        return known or on_host

    # ------------------------------------------------------------------ internals

    def _record(self, record: ClaimRecord) -> None:
        with self._checkpoint_lock:
            self._checkpoint.claims[record.uid] = record
            checkpoint.save(self._config.checkpoint_file, self._checkpoint)

    def save(self) -> None:
        """Write the checkpoint as it is now (after a rebuild started from an empty one)."""
        with self._checkpoint_lock:
            checkpoint.save(self._config.checkpoint_file, self._checkpoint)

    @contextmanager
    def _claim_lock(self, uid: str) -> Iterator[None]:
        """Serialise calls for one claim. A claim's lock lives only while some call holds or awaits
        it, so a node that sees thousands of claims over months keeps no lock per claim."""
        with self._locks_guard:
            entry = self._claim_locks.setdefault(uid, _ClaimLock())
            entry.users += 1
        try:
            with entry.lock:
                yield
        finally:
            with self._locks_guard:
                entry.users -= 1
                if entry.users == 0:
                    del self._claim_locks[uid]

    def locks_held(self) -> int:
        """Claims with a lock right now (for tests: none when no call is in flight)."""
        with self._locks_guard:
            return len(self._claim_locks)


def claim_identity(config: DriverConfig, uid: str) -> tuple[str, str, str] | None:
    """(namespace, name, uid) of a claim folder on the host (for rebuilding a lost checkpoint)."""
    return claim_files.read_identity(claim_files.claim_files(config.claims_dir, uid))
