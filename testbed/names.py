"""Names for objects a test creates, unique across the whole test session."""

from __future__ import annotations

import uuid


def unique_name(prefix: str) -> str:
    """A DNS-label name (prefix plus 8 hex digits) that no other test in the session uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
