"""The kubelet's plugin-registration service: how the kubelet finds our DRA socket.

The kubelet watches its plugin registry folder; when our socket appears (at start, and again every
time the kubelet itself starts and walks the folder) it calls GetInfo, then reports the outcome
with NotifyRegistrationStatus, which we log and keep for the readiness probe.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from tessera.proto.registration.v1 import api_pb2 as pb
from tessera.proto.registration.v1 import api_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"


class RegistrationService:
    def __init__(self, driver: str, endpoint: Path, versions: Sequence[str]) -> None:
        self._info = pb.PluginInfo(
            type=PLUGIN_TYPE, name=driver, endpoint=str(endpoint), supported_versions=list(versions)
        )
        self.registered = threading.Event()
        self.registrations = 0
        """How many times a kubelet has accepted us (each kubelet start registers us again)."""
        self.last_error = ""

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        log.debug("kubelet asked for plugin info")
        return self._info

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        if request.plugin_registered:
            self.registrations += 1
            self.last_error = ""
            self.registered.set()
            log.info("registered with the kubelet (services %s)", ", ".join(self._info.supported_versions))
        else:
            self.registered.clear()
            self.last_error = request.error
            log.error("the kubelet refused the plugin: %s", request.error)
            # As the Go helper does: a refusal is an error, so the kubelet retries the registration.
            context.abort(grpc.StatusCode.UNAVAILABLE, f"registration refused: {request.error}")
        return pb.RegistrationStatusResponse()


def add_to_server(server: grpc.Server, service: RegistrationService) -> None:
    pb_grpc.add_RegistrationServicer_to_server(service, server)
