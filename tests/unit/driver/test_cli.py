"""The daemon's command line: help that is true (the exporter's too, both node programs' flags having
an environment fallback), refusals that say what to fix."""

from __future__ import annotations

import subprocess
import sys
from types import ModuleType

import pytest

from tessera.driver import cli
from tessera.exporter import cli as exporter_cli


@pytest.mark.parametrize("program", [cli, exporter_cli], ids=["tessera-driver", "tessera-exporter"])
def test_help_lists_every_setting_with_its_environment_variable(program: ModuleType) -> None:
    done = subprocess.run([sys.executable, "-m", program.__name__, "--help"], capture_output=True, text=True)
    assert done.returncode == 0
    for action in program.parser()._actions:
        if action.dest != "help":
            assert action.option_strings[0] in done.stdout
            assert "[env " in (action.help or ""), f"{action.option_strings[0]} has no environment fallback"


def test_environment_variables_configure_the_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-7")
    monkeypatch.setenv("TESSERA_KUBELET_ROOT", "/k")
    monkeypatch.setenv("TESSERA_CONTAINER_ENV", "A=1,B=2")
    monkeypatch.setenv("TESSERA_NVML_TIMEOUT", "4.5")
    monkeypatch.setenv("TESSERA_HIGH_PRIORITY_NAMESPACES", "inference, batch")
    config = cli.config_from(cli.parser().parse_args([]))
    assert config.high_priority_namespaces == frozenset({"inference", "batch"})
    assert config.nvml_timeout == 4.5
    assert config.node_name == "gpu-7"
    assert str(config.registration_socket) == "/k/plugins_registry/gpu.tessera.dev-reg.sock"
    assert config.container_env == (("A", "1"), ("B", "2"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the node name is required (--node-name or NODE_NAME)"),
        (["--node-name=n", "--container-env=NOVALUE"], "--container-env 'NOVALUE' is not NAME=VALUE"),
        (["--node-name=n", "--kubelet-root=/" + "x" * 100], "a Unix socket path holds at most 107"),
        (["--node-name=n", "--nvml-timeout=0"], "the NVML timeout must be more than 0 seconds, not 0.0"),
    ],
    ids=["no-node-name", "bad-env", "socket-too-long", "no-nvml-timeout"],
)
def test_bad_settings_stop_the_daemon_before_it_starts_with_one_line(argv: list[str], message: str) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "tessera.driver.cli", *argv], capture_output=True, text=True, env=env
    )
    assert done.returncode == 2
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
