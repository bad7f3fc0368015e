"""examples/ as the real API server sees them: every manifest passes its validation unchanged
(server-side dry run), so what the README tells users to apply is valid Kubernetes."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.cluster import LocalCluster
from testbed.kubectl import kubectl
from tests.chart_helm import REPO

pytestmark = pytest.mark.integration

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_the_api_server_accepts_the_example(cluster: LocalCluster, namespace: str, path: Path) -> None:
    output = kubectl(cluster.admin_kubeconfig, "apply", "--dry-run=server", "-n", namespace, "-f", str(path))
    assert "(server dry run)" in output
    assert (
        output.count("(server dry run)")
        == sum(1 for line in path.read_text().splitlines() if line == "---") + 1
    )
