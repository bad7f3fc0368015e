"""Socket paths follow the kubelet's conventions and always fit a Unix socket address."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.driver.config import UNIX_PATH_MAX, DriverConfig, DriverSource


def test_sockets_are_where_a_stock_kubelet_looks() -> None:
    config = DriverConfig(node_name="n1")
    assert config.registration_socket == Path("/var/lib/kubelet/plugins_registry/gpu.tessera.dev-reg.sock")
    assert config.dra_socket == Path("/var/lib/kubelet/plugins/gpu.tessera.dev/dra.sock")


def test_a_pod_uid_makes_socket_names_unique_for_rolling_updates() -> None:
    uid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    config = DriverConfig(node_name="n1", pod_uid=uid)
    assert config.registration_socket.name == f"gpu.tessera.dev-{uid}-reg.sock"
    assert config.dra_socket.name == f"dra-{uid}.sock"


def test_names_too_long_for_a_socket_fall_back_to_hashed_ones_that_fit() -> None:
    deep = Path("/tmp/" + "d" * 40)
    config = DriverConfig(node_name="n1", kubelet_root=deep, pod_uid="0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
    for socket in (config.registration_socket, config.dra_socket):
        assert len(str(socket).encode()) <= UNIX_PATH_MAX
        assert "0f1e2d3c" not in socket.name
    config.validate()


def test_a_kubelet_root_too_deep_for_any_socket_name_is_refused_before_anything_starts() -> None:
    config = DriverConfig(node_name="n1", kubelet_root=Path("/" + "x" * 100))
    with pytest.raises(ValueError, match="holds at most 107"):
        config.validate()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (DriverConfig(node_name=""), "node name is required"),
        (
            DriverConfig(node_name="n", source=DriverSource(mode="magic")),
            "must be auto, own or nvidia-toolkit",
        ),
        (DriverConfig(node_name="n", container_env=(("A=B", "c"),)), "is not valid"),
    ],
    ids=["no-node", "bad-source", "bad-env-name"],
)
def test_settings_that_cannot_work_are_refused_with_the_reason(config: DriverConfig, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config.validate()
