"""The shim tier's fixtures: those of every tier that runs processes under the shim
(tests/claim_fixtures.py builds the shim on import, before this tier's modules are collected)."""

from tests.claim_fixtures import built, make_claim, simulated, simulated_only

__all__ = ["built", "make_claim", "simulated", "simulated_only"]
