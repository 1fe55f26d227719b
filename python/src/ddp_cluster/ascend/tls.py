"""The TLS switch of Ascend device NICs (``hccn_tool -i N -tls -g``): HCCL refuses to link devices whose TLS
settings differ, so a cluster is checked as a whole before anything changes.

The tool prints, per device (driver manuals; older drivers omit ``tls preconfigured``)::

    dev_id:0, tls switch[0](0:disable, 1:enable), tls preconfigured[1](0:non-preset, 1:preset), tls alarm ...
    dev_id:0, [pub cert] info:
             issuer[/C=CN/ST=GD/O=HUAWEI/OU=2012/CN=2_1thCA]

The vendor's fix is to set one value everywhere (``hccn_tool -i N -tls -s enable 0``); which one is a security
choice, so the check names the odd devices and the majority and changes nothing.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

_SWITCH = re.compile(r"tls switch\s*\[\s*([01])\s*\]")
FIX = "for i in {0..7}; do hccn_tool -i $i -tls -s enable 0; done"


def tls_switch(text: str) -> int | None:
    """The switch (0 or 1) in one device's ``-tls -g`` output; None when the output has none."""
    found = _SWITCH.search(text or "")
    return int(found.group(1)) if found else None


@dataclass(frozen=True)
class TlsVerdict:
    majority: int | None
    settings: dict[str, dict[int, int | None]]  # host -> device -> switch (None: unreadable)
    odd: list[tuple[str, int, int | None]]  # (host, device, switch) that differ from the majority

    @property
    def ok(self) -> bool:
        return not self.odd

    def lines(self) -> list[str]:
        """One line per odd device, for a message."""
        names = {0: "0 (disabled)", 1: "1 (enabled)", None: "unreadable"}
        return [f"{host} device {device}: tls switch {names[switch]}" for host, device, switch in self.odd]


def tls_verdict(outputs: Mapping[str, Mapping[int | str, str]], required: int | None = None) -> TlsVerdict:
    """Every device's switch from its ``-tls -g`` output ({host: {device: text}}), the majority (or
    ``required``, when the site requires a value) and the devices that differ from it, in host and device
    order."""
    settings = {
        str(host): {
            int(device): tls_switch(text) for device, text in sorted(devices.items(), key=lambda i: int(i[0]))
        }
        for host, devices in outputs.items()
    }
    counts = Counter(
        switch for devices in settings.values() for switch in devices.values() if switch is not None
    )
    majority = (
        required
        if required is not None
        else (max(sorted(counts), key=lambda v: counts[v]) if counts else None)
    )
    odd = [
        (host, device, switch)
        for host, devices in settings.items()
        for device, switch in devices.items()
        if switch is None or switch != majority
    ]
    return TlsVerdict(majority, settings, odd)
