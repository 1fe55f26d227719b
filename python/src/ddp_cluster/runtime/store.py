"""The job's rendezvous store, listening on the cluster address only.

torch's TCPStore server binds its port on every address of the node (``*:MASTER_PORT``) whatever host it is
given: the host is only where the clients connect. It can take a socket already bound instead
(``master_listen_fd``), and a server made with ``multi_tenant=True`` is shared by every later multi-tenant
TCPStore of the same process on the same port. Both rendezvous that start a server make theirs multi-tenant:
``init_process_group`` on rank 0 (``env://`` and ``tcp://``, ``torch.distributed.rendezvous``) and torchrun's
agent on node 0 (its static rendezvous). So the process that will host the store makes the server first, on a
socket bound to MASTER_ADDR:MASTER_PORT, keeps it, and the rendezvous then finds it and uses it: the port
listens on the cluster address alone. Measured with torch 2.13 (``ss -Htln``): ``*:29501`` without it,
``172.30.99.10:29501`` with it.

- :func:`serve_master_store`: the server on ADDR:PORT (what to keep for as long as the job runs).
- :func:`rank_store`: a rank's: the server where this rank hosts the rendezvous (rank 0 of a job that
  ``init_process_group`` starts itself), None where another process hosts it (torchrun's agent: its ranks run
  with ``TORCHELASTIC_USE_AGENT_STORE=True``), where there is none (a single process), or under
  torch_npu_run, whose ParallelStore has no such option; :func:`hosted_store` keeps it for a ``with`` block
  (around the process group's).
- ``python -m ddp_cluster.runtime.store RUNNER ARGS...``: a launcher module (``torch.distributed.run``) run in
  this process after the server is made, on the node of ``--node-rank 0``, from ``--master-addr`` and
  ``--master-port``: torchrun's agent then hosts its store on the cluster address alone.

torch is imported only when a server is made (``ddp_cluster.run`` imports this module without torch).
"""

from __future__ import annotations

import errno
import os
import runpy
import socket
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from ddp_cluster.errors import DistEnvError
from ddp_cluster.runtime.distenv import DistEnv

# The launcher module whose rendezvous store can be bound this way (torchrun's static rendezvous);
# torch_npu.distributed.run's ParallelStore cannot, and is run as it is.
TORCHRUN = "torch.distributed.run"
# The pending connections the kernel keeps for the store while it is busy (torch's own listen backlog).
BACKLOG = 2048
# torchrun's agents and every rank set this where the agent hosts the store and every rank is its client.
AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"


def bind(addr: str, port: int) -> socket.socket:
    """A listening TCP socket on ADDR:PORT (ADDR a name or an address; its first address, IPv4 first);
    DistEnvError naming both and the fix when it cannot be bound."""
    try:
        found = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
    except OSError as error:
        raise DistEnvError(
            f"MASTER_ADDR={addr!r} does not resolve on this node ({error}): it must be the name or address "
            "of the node of rank 0"
        ) from error
    found.sort(key=lambda entry: entry[0] != socket.AF_INET)
    family, kind, proto, _, where = found[0]
    listener = socket.socket(family, kind, proto)
    try:
        # As torch's own server: a port a finished job left in TIME_WAIT is taken again at once.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(where)
        listener.listen(BACKLOG)
    except OSError as error:
        listener.close()
        raise DistEnvError(
            f"the rendezvous store cannot listen on {addr}:{port} ({where[0]}: {error.strerror or error}): "
            + (
                "rank 0 must run on the node MASTER_ADDR names"
                if error.errno == errno.EADDRNOTAVAIL
                else "something else holds the port: stop it, or give the job another master port"
            )
        ) from error
    return listener


def serve_master_store(addr: str, port: int, timeout_s: float = 300.0) -> Any:
    """The rendezvous store's server on ADDR:PORT only: a multi-tenant ``torch.distributed.TCPStore`` that
    the process keeps (the rendezvous reuses it while it lives: drop it after the process group is
    destroyed)."""
    import torch.distributed as dist

    listener = bind(addr, port)
    return dist.TCPStore(  # type: ignore[attr-defined]
        addr,
        port,
        None,  # the rendezvous' own store counts its workers; this one waits for none
        True,
        timedelta(seconds=timeout_s),
        wait_for_workers=False,
        multi_tenant=True,
        master_listen_fd=listener.detach(),  # the store's from now on
    )


def hosts_store(env: DistEnv, environ: Mapping[str, str]) -> bool:
    """Whether this rank's own ``init_process_group`` starts the rendezvous store: rank 0 of more than one
    process, with no agent hosting it (torchrun) and not under torch_npu_run (its ParallelStore)."""
    if env.world_size <= 1 or env.rank != 0:
        return False
    if environ.get(AGENT_STORE) == "True" or environ.get("TORCH_NPU_ELASTIC_USE_AGENT_STORE"):
        return False
    return environ.get("DDP_LAUNCHER") != "torch_npu_run"


def rank_store(env: DistEnv, environ: Mapping[str, str] | None = None, timeout_s: float = 300.0) -> Any:
    """This rank's store server on MASTER_ADDR:MASTER_PORT when it hosts the rendezvous (see
    :func:`hosts_store`), else None. Kept by the caller until the process group is destroyed."""
    if not hosts_store(env, os.environ if environ is None else environ):
        return None
    return serve_master_store(env.master_addr, env.master_port, timeout_s)


@contextmanager
def hosted_store(
    env: DistEnv, timeout_s: float = 300.0, environ: Mapping[str, str] | None = None
) -> Iterator[Any]:
    """:func:`rank_store` for the length of a ``with`` block: enter it before the process group is made, leave
    it after the group is destroyed."""
    store = rank_store(env, environ, timeout_s)
    try:
        yield store
    finally:
        del store


def option(args: Sequence[str], name: str) -> str | None:
    """The value of torchrun's option ``--name`` (``--name V``, ``--name=V``, or with '_' for '-') among the
    launcher's own arguments, those before ``-m`` / ``--module`` (the program and its arguments follow);
    None when absent."""
    spellings = {f"--{name}", f"--{name.replace('-', '_')}"}
    for index, arg in enumerate(args):
        if arg in ("-m", "--module", "--"):
            break
        key, equals, value = arg.partition("=")
        if key in spellings:
            if equals:
                return value
            return args[index + 1] if index + 1 < len(args) else None
    return None


def launcher_store(module: str, args: Sequence[str]) -> tuple[str, int] | None:
    """Where the launcher MODULE run with ARGS hosts its store, when this process must bind it first:
    torchrun on node rank 0 with its master address and port; None otherwise."""
    if module != TORCHRUN or option(args, "node-rank") != "0":
        return None
    addr, port = option(args, "master-addr"), option(args, "master-port")
    if not addr or not port or not port.isdigit():
        return None  # torchrun's own defaults (127.0.0.1:29500): nothing reaches it from another node
    return addr, int(port)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m ddp_cluster.runtime.store RUNNER_MODULE ARGS...", file=sys.stderr)
        return 2
    module, launcher_args = args[0], args[1:]
    store = None
    where = launcher_store(module, launcher_args)
    if where is not None:
        try:
            store = serve_master_store(*where)
        except DistEnvError as error:
            print(f"ddp_cluster.runtime.store: {error}", file=sys.stderr)
            return 2
    sys.argv = [module, *launcher_args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        del store  # after the launcher: its agent's rendezvous used this server to the end
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
