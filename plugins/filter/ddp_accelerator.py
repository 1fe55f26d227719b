"""The facts of an accelerator kind, for Jinja: ``{{ cluster_accelerator | ddp_accelerator('backend') }}``.

One filter over the registry (``ddp_cluster.accelerators``: a module per kind), so roles and playbooks ask the
kind instead of branching on its name:

    {{ cluster_accelerator | ddp_accelerator }}                       -> every fact of the kind, a dict
    {{ cluster_accelerator | ddp_accelerator('host_roles') }}         -> one fact
    {{ cluster_accelerator | ddp_accelerator('kinds') }}              -> every kind's name (any input)
"""

from __future__ import annotations

import site
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster import accelerators


def ddp_accelerator(kind: Any, fact: Any = None) -> Any:
    """The kind's facts (:meth:`ddp_cluster.accelerators.base.Accelerator.facts`), or the one named ``fact``;
    ``'kinds'`` lists the registry's kinds whatever ``kind`` is."""
    if fact == "kinds":
        return list(accelerators.REGISTRY)
    try:
        facts = accelerators.get(str(kind)).facts()
    except accelerators.UnknownAccelerator as error:
        raise AnsibleFilterError(f"ddp_accelerator: {error}") from None
    if fact is None:
        return facts
    if str(fact) not in facts:
        raise AnsibleFilterError(
            f"ddp_accelerator: no fact {fact!r}; the facts are kinds, {', '.join(facts)}"
        )
    return facts[str(fact)]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"ddp_accelerator": ddp_accelerator}
