"""Reading what a probe command printed as ``key: value`` lines (one command per server answers several
checks)."""

from __future__ import annotations

import site
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.ascend import tls


def ddp_key_lines(text: Any) -> dict[str, list[str]]:
    """``key: value`` lines as {key: [values in order]}; other lines are ignored, empty values kept as ''."""
    found: dict[str, list[str]] = {}
    for line in str(text or "").splitlines():
        key, sep, value = line.partition(":")
        if not sep or not key or not key.replace("_", "").isalnum() or (value and not value.startswith(" ")):
            continue
        found.setdefault(key, []).append(value.strip())
    return found


def _device_blocks(text: str) -> dict[int | str, str]:
    """``== N`` headed blocks (one per device) of the preflight's TLS probe."""
    blocks: dict[int | str, str] = {}
    for block in str(text or "").split("== ")[1:]:
        head, _, body = block.partition("\n")
        if head.strip().isdigit():
            blocks[int(head.strip())] = body
    return blocks


def ddp_tls_verdict(outputs: Mapping[str, Any], required: Any = None) -> dict[str, Any]:
    """The cluster's TLS switches from each host's probe output ({host: text of ``== N`` blocks}): the
    majority (or the required value) and the odd devices as lines."""
    want = None if required in (None, "") else int(required)
    blocks = {str(host): _device_blocks(text) for host, text in outputs.items()}
    verdict = tls.tls_verdict(blocks, want)
    unread = [
        f"{host}: no device's TLS switch could be read" for host, devices in blocks.items() if not devices
    ]
    return {
        "ok": verdict.ok and not unread,
        "majority": verdict.majority,
        "lines": unread + verdict.lines(),
        "fix": tls.FIX,
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"ddp_key_lines": ddp_key_lines, "ddp_tls_verdict": ddp_tls_verdict}
