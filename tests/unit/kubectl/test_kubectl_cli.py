"""``kubectl tessera``'s flags and kubeconfig handling, as kubectl's: --kubeconfig, else $KUBECONFIG,
else ~/.kube/config; --context; the context's namespace unless -n or -A says otherwise; and one
line on stderr, exit status 1, when the API server cannot be reached."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiException

from tessera.kubectl import snapshot as reading
from tessera.kubectl.cli import kubeconfig_path, main, namespace_of, parser
from tessera.kubectl.snapshot import listed
from tessera.kubectl.usage import Usage, add_to_gpus, read_metrics
from tests.unit.kubectl.kubectl_samples import gpu_slice, snapshot, used


def _kubeconfig(path: Path, server: str = "https://127.0.0.1:1") -> Path:
    """Two contexts: 'work' (current, namespace 'ml') and 'other' (no namespace)."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "work", "context": {"cluster": "c", "user": "u", "namespace": "ml"}},
                    {"name": "other", "context": {"cluster": "c", "user": "u"}},
                ],
                "current-context": "work",
            }
        )
    )
    return path


def test_the_namespace_is_the_contexts_unless_a_flag_says_otherwise(tmp_path: Path) -> None:
    config = str(_kubeconfig(tmp_path / "config"))
    assert namespace_of(parser().parse_args(["pods"]), config) == "ml"
    assert namespace_of(parser().parse_args(["pods", "--context", "other"]), config) == "default"
    assert namespace_of(parser().parse_args(["pods", "-n", "team"]), config) == "team"
    assert namespace_of(parser().parse_args(["pods", "-A"]), config) is None


def test_the_kubeconfig_is_the_flag_else_the_variable_else_the_home_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert kubeconfig_path(parser().parse_args(["gpus"])) is None
    (tmp_path / ".kube").mkdir()
    home = _kubeconfig(tmp_path / ".kube" / "config")
    assert kubeconfig_path(parser().parse_args(["gpus"])) == str(home)
    monkeypatch.setenv("KUBECONFIG", "/a:/b")
    assert kubeconfig_path(parser().parse_args(["gpus"])) == "/a:/b"
    assert kubeconfig_path(parser().parse_args(["gpus", "--kubeconfig", "/c"])) == "/c"


def test_an_unreachable_api_server_is_one_line_and_status_1(tmp_path: Path) -> None:
    config = _kubeconfig(tmp_path / "config", server="https://127.0.0.1:9")
    out, err = io.StringIO(), io.StringIO()
    assert main(["gpus", "--kubeconfig", str(config), "--no-usage"], out, err) == 1
    assert out.getvalue() == ""
    assert err.getvalue().startswith("kubectl tessera: the API server could not be reached: ")
    assert err.getvalue().count("\n") == 1


def test_a_missing_kubeconfig_context_is_one_line_and_status_1(tmp_path: Path) -> None:
    config = _kubeconfig(tmp_path / "config")
    out, err = io.StringIO(), io.StringIO()
    assert main(["gpus", "--kubeconfig", str(config), "--context", "absent"], out, err) == 1
    assert err.getvalue().startswith("kubectl tessera: no usable kubeconfig: ")


@pytest.mark.parametrize("command", [[], ["gpus"], ["pods"], ["why"], ["queue"]])
def test_help_answers_for_every_command(command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tessera.kubectl.cli", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.startswith("usage: kubectl tessera")


def test_exporter_figures_are_read_per_gpu_and_per_claim() -> None:
    exposition = "\n".join(
        [
            "# TYPE tessera_gpu_memory_used_bytes gauge",
            'tessera_gpu_memory_used_bytes{node="n",device_uuid="GPU-1",device_index="0",model="H100"} 3e+09',
            "# TYPE tessera_gpu_utilization_ratio gauge",
            'tessera_gpu_utilization_ratio{node="n",device_uuid="GPU-1",device_index="0",model="H100"} 0.5',
            "# TYPE tessera_container_gpu_memory_used_bytes gauge",
            'tessera_container_gpu_memory_used_bytes{namespace="team",pod="p",container="a",claim="c",'
            'node="n",device_uuid="GPU-1",device_index="0"} 1e+09',
            'tessera_container_gpu_memory_used_bytes{namespace="team",pod="p",container="b",claim="c",'
            'node="n",device_uuid="GPU-1",device_index="0"} 1e+09',
            "",
        ]
    )
    usage = Usage()
    read_metrics(exposition, usage)
    rows = [{"uuid": "GPU-1", "shares": [{"namespace": "team", "claim": "c"}]}]
    add_to_gpus(rows, usage)
    assert rows == [
        {
            "uuid": "GPU-1",
            "memoryUsed": 3e9,
            "busy": 0.5,
            "shares": [{"namespace": "team", "claim": "c", "memoryUsed": 1e9}],
        }
    ]


def test_a_kind_the_caller_may_not_read_or_the_cluster_does_not_serve_reads_as_empty_and_is_named() -> None:
    def refused(status: int) -> Callable[..., Any]:
        def call(**_: Any) -> Any:
            raise ApiException(status=status, reason="no")

        return call

    missing: list[str] = []
    assert listed("devicetaintrules", refused(404), missing) == []
    assert listed("workloads", refused(403), missing) == []
    assert missing == ["devicetaintrules", "workloads"]
    with pytest.raises(ApiException):
        listed("resourceslices", refused(500), missing)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_gpus_draws_bars_at_a_terminal_columns_in_a_pipe_and_data_with_o(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = snapshot([gpu_slice("node-a", [80])], [used("node-a", 0, "20Gi", "c", pod="p")])
    monkeypatch.setattr(reading, "read", lambda api, namespace, kinds: found)
    config = str(_kubeconfig(tmp_path / "config"))

    def run(out: io.StringIO, *flags: str) -> str:
        assert main(["gpus", "--kubeconfig", config, "--no-usage", *flags], out, io.StringIO()) == 0
        return out.getvalue()

    assert "memory [###---------] 20Gi of 80Gi allocated" in run(_Terminal())
    assert run(io.StringIO()).startswith("NODE     GPU ")
    assert json.loads(run(io.StringIO(), "-o", "json"))["gpus"][0]["shares"][0]["pod"] == "p"
