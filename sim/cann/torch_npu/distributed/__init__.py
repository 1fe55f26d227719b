"""Stand-in of torch_npu.distributed: registers the ``parallel://`` init method, as the real package does.

The real torch_npu serves ``parallel://`` (and torch_npu_run's "parallel" rendezvous) with its ParallelStore;
the stand-in has none and hands ``parallel://HOST:PORT`` to torch's own ``tcp://`` handler, which under a
launcher's agent store (TORCHELASTIC_USE_AGENT_STORE) connects as a client, as the real handler does.
"""

from __future__ import annotations

import importlib
from typing import Any

# The module (torch.distributed.rendezvous is also the name of a function there).
_rendezvous: Any = importlib.import_module("torch.distributed.rendezvous")

_SCHEME = "parallel"


def _parallel_rendezvous_handler(url: str, **kwargs: Any) -> Any:
    return _rendezvous._tcp_rendezvous_handler("tcp" + url[len(_SCHEME) :], **kwargs)


def _rendezvous_init() -> None:
    if _SCHEME not in _rendezvous._rendezvous_handlers:
        _rendezvous.register_rendezvous_handler(_SCHEME, _parallel_rendezvous_handler)


_rendezvous_init()
