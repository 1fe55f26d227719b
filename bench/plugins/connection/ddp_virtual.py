"""Connection ``ddp_virtual``: a virtual server for the controller benchmark (bench/bench_controller.py). No
container, no network: a module run arrives as the AnsiballZ wrapper pipelining sends, is parsed to its name
and arguments, and bench/virtual/server.py answers from the server's state under $DDP_VIRTUAL_DIR. Each
command is one line of the server's log (what a real controller would run over ssh); a module it does not know
fails.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.connection import ConnectionBase

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "virtual"))

import server

DOCUMENTATION = r"""
name: ddp_virtual
short_description: A virtual server answered from a state file (controller benchmark)
description:
  - Answers module runs and commands as bench/virtual/server.py says a server of that state would.
options:
  remote_addr:
    description: The server's address (bench/virtual/hosts.py gives vs<i> 10.64.0.0 + i + 1).
    default: inventory_hostname
    vars:
      - name: inventory_hostname
      - name: ansible_host
  remote_user:
    description: Ignored (the virtual server has one user).
    vars:
      - name: ansible_user
  pipelining:
    description: Modules sent on stdin, as ssh does with the project's ansible.cfg (pipelining = true).
    type: boolean
    default: true
    ini:
      - section: defaults
        key: pipelining
      - section: ssh_connection
        key: pipelining
    env:
      - name: ANSIBLE_PIPELINING
    vars:
      - name: ansible_pipelining
"""


class Connection(ConnectionBase):
    transport = "ddp_virtual"
    has_pipelining = True

    def _host(self) -> str:
        return server.host_of(str(self.get_option("remote_addr")))

    def _connect(self) -> Connection:
        self._connected = True
        return self

    def exec_command(
        self, cmd: str, in_data: bytes | None = None, sudoable: bool = True
    ) -> tuple[int, bytes, bytes]:
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        host = self._host()
        try:
            # A module put as a file (no pipelining: wait_for_connection, or become): read it from the server.
            put = re.search(r"python[0-9.]* (/\S+/AnsiballZ_[A-Za-z0-9_.]+\.py)", cmd)
            if not in_data and put and self._local(put.group(1)).is_file():
                in_data = self._local(put.group(1)).read_bytes()
            if in_data and b"_ansiballz_main(" in in_data:
                module, args = server.parse_payload(in_data)
                server.log(host, "module", module)
                return 0, json.dumps(server.answer(host, module, args)).encode(), b""
            server.log(host, "command", cmd[:80])
            rc, out, err = server.shell(host, cmd)
            return rc, out.encode(), err.encode()
        except server.Unknown as error:
            # Loud: the bench must not skip work a real server would do.
            raise AnsibleConnectionFailure(f"ddp_virtual: {error}") from error

    def _local(self, path: str) -> Path:
        return server.root() / self._host() / "fs" / path.lstrip("/")

    def put_file(self, in_path: str, out_path: str) -> None:
        super().put_file(in_path, out_path)
        server.log(self._host(), "put", out_path)
        target = self._local(out_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(in_path, target)

    def fetch_file(self, in_path: str, out_path: str) -> None:
        super().fetch_file(in_path, out_path)
        server.log(self._host(), "fetch", in_path)
        shutil.copyfile(self._local(in_path), out_path)

    def close(self) -> None:
        self._connected = False

    def reset(self) -> None:
        self.close()
