"""Client set-up says which credentials it looked for when it finds none, and merges KUBECONFIG lists."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.kube import api_client

KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: {name}
  cluster: {{server: "https://127.0.0.1:{port}"}}
users:
- name: {name}
  user: {{token: t}}
contexts:
- name: {name}
  context: {{cluster: {name}, user: {name}}}
{current}
"""


def test_no_credentials_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(RuntimeError, match="pass a kubeconfig, set KUBECONFIG, or run in a pod"):
        api_client()


def test_kubeconfig_list_is_merged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As with kubectl, KUBECONFIG=a:b merges both files; the current context may come from either."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.write_text(KUBECONFIG.format(name="a", port=1111, current=""))
    second.write_text(KUBECONFIG.format(name="b", port=2222, current="current-context: a"))
    monkeypatch.setenv("KUBECONFIG", f"{first}:{second}")
    assert api_client().configuration.host == "https://127.0.0.1:1111"
