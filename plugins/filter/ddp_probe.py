"""Reading what a probe command printed as ``key: value`` lines (one command per server answers several checks)."""

from __future__ import annotations

from typing import Any


def ddp_key_lines(text: Any) -> dict[str, list[str]]:
    """``key: value`` lines as {key: [values in order]}; other lines are ignored, empty values kept as ''."""
    found: dict[str, list[str]] = {}
    for line in str(text or "").splitlines():
        key, sep, value = line.partition(":")
        if not sep or not key or not key.replace("_", "").isalnum() or (value and not value.startswith(" ")):
            continue
        found.setdefault(key, []).append(value.strip())
    return found


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"ddp_key_lines": ddp_key_lines}
