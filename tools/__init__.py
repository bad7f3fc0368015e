"""Generators of docs pages from the code; development only (see dev/pyproject.toml)."""
