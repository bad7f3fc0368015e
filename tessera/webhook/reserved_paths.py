"""Where a container whose share the shim enforces may not mount a volume: the claim's folder at
``/run/tessera`` and anything under it, and ``/etc/ld.so.preload``; pure.

The pod's volumes are the tenant's to write, and the runtime mounts them next to the claim's CDI
mounts: a volume at ``/run/tessera/limits`` (a ConfigMap's key by ``subPath``, say) lands on top of
the node's limits file. The shim refuses to read a file that is not its claim folder's own and stops
the process (tessera/shim/src/limits_source.h), so such a pod could never run a CUDA program: the
webhook says so when the pod is created, in one sentence, instead.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath
from typing import Any

from tessera.gpu_request import Refusal
from tessera.quantity import quote

CLAIM_FOLDER = PurePosixPath("/run/tessera")
"""tessera.driver.claim_files.CONTAINER_DIR, named here so the webhook does not import the driver."""
PRELOAD = PurePosixPath("/etc/ld.so.preload")


def reserved(path: str) -> bool:
    """Whether a mount at ``path`` would cover something the shim or the loader reads."""
    # As the kernel resolves it: "/run/x/../tessera" and "//run/./tessera" are /run/tessera too.
    mounted = PurePosixPath("/" + posixpath.normpath(path).lstrip("/"))
    return mounted in (PRELOAD, CLAIM_FOLDER) or CLAIM_FOLDER in mounted.parents


def review(items: Iterable[tuple[str, Mapping[str, Any]]]) -> None:
    """Refuse the first (where, container) whose volume mounts cover a reserved path."""
    for where, container in items:
        for mount in container.get("volumeMounts") or []:
            path = mount.get("mountPath") if isinstance(mount, Mapping) else None
            if isinstance(path, str) and reserved(path):
                raise Refusal(
                    f"{where}: volume {quote(str(mount.get('name', '')))} is mounted at {quote(path)}, "
                    f"where the node puts its GPU share's limits and shim ({CLAIM_FOLDER} and "
                    f"{PRELOAD} are reserved); mount it elsewhere."
                )
