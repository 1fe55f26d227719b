"""Port lists as the kernel's ``net.ipv4.ip_local_reserved_ports`` writes them, for the HCCL ports an NPU
server reserves (the npu_host role's sysctl).

The kernel reads the setting back as sorted, merged ranges joined by commas, single ports alone; producing the
same text keeps the sysctl task idempotent.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ddp_cluster.errors import DdpClusterError

_PORT_ITEM = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


class PortRangeError(DdpClusterError):
    """A port list item is not a port or a port range within 1-65535."""


def port_ranges(*specs: Any) -> str:
    """The union of port lists (``"8080,60000-60015"``, a port, a list of either), as the kernel writes it."""
    ports: set[int] = set()
    for spec in specs:
        items: Sequence[Any] = spec if isinstance(spec, list | tuple) else [spec]
        for item in items:
            for part in str("" if item is None else item).replace(" ", ",").split(","):
                if not part.strip():
                    continue
                match = _PORT_ITEM.match(part)
                if not match:
                    raise PortRangeError(f"{part!r} is not a port or a port range (such as 60000-60015)")
                low = int(match.group(1))
                high = int(match.group(2) or low)
                if not 0 < low <= high <= 65535:
                    raise PortRangeError(f"{part!r} is not a port range within 1-65535")
                ports.update(range(low, high + 1))
    ranges: list[str] = []
    ordered = sorted(ports)
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        low, high = ordered[start], ordered[end]
        ranges.append(str(low) if low == high else f"{low}-{high}")
        start = end + 1
    return ",".join(ranges)
