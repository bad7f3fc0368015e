"""Every row of docs/webhook.md's table of HAMi inputs, driven through the webhook's decision: a
honoured row is converted without a warning, a warned row is converted with the row's message in a
warning, a refused row is denied with it; and the table names every HAMi input Tessera knows."""

from __future__ import annotations

import pytest

from tessera.names import (
    HAMI_ANNOTATIONS,
    HAMI_DISABLE_CONTROL,
    HAMI_GPU_POLICY,
    HAMI_MIG_PREFIX,
    HAMI_NODE_POLICY,
    HAMI_PRIORITY,
    HAMI_RESOURCES,
    HAMI_SCORING_WEIGHTS,
    HAMI_VGPU_MODE,
)
from tessera.quantity import GiB
from tessera.webhook.admission import admit
from tessera.webhook.fleet import Fleet
from tessera.webhook.notices import IGNORED_ENV
from tessera.webhook.policies import GPU_POLICIES, MAX_WARNING, NODE_POLICIES
from tests.unit.webhook.hami_table import ANSWERS, Row, pod_of, rows
from tests.unit.webhook.webhook_samples import request

PRODUCT = "NVIDIA H100 80GB HBM3"
TABLE_FLEET = Fleet(
    memory_sizes=(80 * GiB,),
    max_gpus_per_node=2,
    products={PRODUCT: 2},
    uuid_products={"GPU-11111111-1111-1111-1111-111111111111": PRODUCT, "GPU-2222": PRODUCT},
    uuids=("GPU-11111111-1111-1111-1111-111111111111", "GPU-2222"),
    mig_profiles=frozenset({"1g.10gb", "3g.40gb"}),
)
"""What the integration test's bed publishes: two simulated H100s and MIG instances of two profiles."""

ROWS = rows()


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_the_webhook_answers_each_row_as_the_table_says(row: Row) -> None:
    response = admit(request(pod_of(row)), TABLE_FLEET).response["response"]  # type: ignore[arg-type]
    assert row.answer in ANSWERS
    if row.answer == "refused":
        assert not response["allowed"]
        assert row.message and row.message in response["status"]["message"]
        return
    assert response["allowed"] and response["patch"], "a honoured or warned row is converted"
    warnings = response.get("warnings", [])
    if row.answer == "honoured":
        assert warnings == []
    else:
        assert row.message and any(row.message in warning for warning in warnings), warnings
    assert all(len(warning) <= MAX_WARNING for warning in warnings)


def test_the_table_names_every_hami_input_the_webhook_knows() -> None:
    named = " ".join(f"{row.input} {row.id}" for row in ROWS)
    inputs = [
        *HAMI_RESOURCES,
        HAMI_PRIORITY,
        HAMI_MIG_PREFIX,
        *HAMI_ANNOTATIONS,
        HAMI_VGPU_MODE,
        HAMI_DISABLE_CONTROL,
        HAMI_SCORING_WEIGHTS,
        *IGNORED_ENV,
    ]
    assert [name for name in inputs if name not in named] == []
    for annotation, policies in ((HAMI_GPU_POLICY, GPU_POLICIES), (HAMI_NODE_POLICY, NODE_POLICIES)):
        values = {p for row in ROWS for p in row.annotations.get(annotation, "").split(",") if p}
        assert set(policies) <= values, f"{annotation}: a row for each of {sorted(policies)}"
