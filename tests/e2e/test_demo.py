"""The short CI form of `make demo`: the same story on the same set-up (demo/story.py), and every
claim its output makes checked against the figures it read back from the system."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo import story
from testbed.binaries import COMPONENTS
from testbed.chart_bed import ChartBed

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartBed]:
    if os.geteuid() != 0:
        pytest.skip("real nodes need root: containerd and the kubelet mount, and manage cgroups and links")
    missing = [n for n in ("etcd", "kubernetes", "kueue", "helm") if COMPONENTS[n].missing()]
    if missing:
        pytest.fail(f"test-bed binaries not built ({', '.join(missing)}): run `make binaries`")
    work: Path = tmp_path_factory.mktemp("demo")
    with story.demo_bed(work) as running:
        yield running


def test_every_claim_of_the_demo_holds(bed: ChartBed) -> None:
    shown = story.run(bed)
    failed = [claim for claim, holds in story.claims(shown) if not holds]
    assert failed == [], f"{failed}\n{shown}"
    # The figures behind the claims, as the output prints them.
    assert shown.refused["rc"] == 2  # CUDA_ERROR_OUT_OF_MEMORY
    assert shown.neighbour["rc"] == 0
    assert shown.placements["tessera-example-hami"].memory == shown.refused["total"]
    gang = f"needs {story.GANG_PODS} shares of {story.GANG_MIB // 1024}Gi/{story.GANG_CORES} at once"
    assert shown.queue_message.startswith(gang), shown.queue_message
