"""The real-client tier's fixtures: claims on simulated nodes (tests/claim_fixtures.py, shared with
the shim tier) and each line of NVIDIA's Python clients in turn (client_lines.py)."""

from __future__ import annotations

import pytest

from tests.claim_fixtures import built, make_claim
from tests.clients.client_lines import LINES, ClientLine

__all__ = ["built", "make_claim"]


# Module-scoped so that a module can run something once per line (the peer suite's run without the
# shim) and compare every test's runs with it.
@pytest.fixture(scope="module", params=LINES, ids=[line.name for line in LINES])
def line(request: pytest.FixtureRequest) -> ClientLine:
    """Each line of clients in turn. The CUDA 13 line's venv is made by make: a checkout without it
    fails here, saying how to make it, rather than testing one line only."""
    chosen: ClientLine = request.param
    assert chosen.python.exists(), f"{chosen.python} is missing: run `make clients-cuda13`"
    return chosen
