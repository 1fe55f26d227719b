#!/usr/bin/python
"""Ship the node image from the controller to servers through a registry: push once, every server pulls the
layers it lacks, in parallel. The logic is ddp_cluster.image.distribute (shipped as module_utils), unit-tested
with the package."""

from __future__ import annotations

DOCUMENTATION = r"""
module: ddp_image_distribute
short_description: Push an image to a registry once and pull it on every server that lacks it
description:
  - Runs on the controller. With no C(registry), starts Docker's Distribution registry (C(docker-registry
    serve), the Debian package) bound to the controller's 127.0.0.1:C(port) for the duration of the call, its
    storage kept in C(storage) so that a later push sends only new layers, taking only a password made for
    this call (htpasswd, bcrypt), which the push and each pull get in a temporary client configuration
    (C(DOCKER_CONFIG)) and on stdin, never in an argv or the result. Each server pulls
    C(127.0.0.1:port/NAME@DIGEST) (the push's digest) through C(ssh -R 127.0.0.1:port:127.0.0.1:port); its
    engine treats a 127.0.0.0/8 registry as insecure by default, so no engine setting changes, and nothing
    listens beyond loopback. The tunnel lives as long as that server's pull; the registry stops when the call
    ends, also on failure (and with the module's process).
  - Every server pulls by digest and compares the ID of the image it got with the built image's ID; on a
    mismatch the pulled image is removed and that server fails, naming both IDs (C(receiver_script), the
    role's files/pull-image.sh).
  - A pull that fails for a reason that passes (ssh's own failure, sshd dropping the connection in its
    handshake, a tunnel that did not come up, a connection closed or reset, a registry's EOF) is tried again
    after 2, 4 and 8 s, each plus a jitter; an image that is not the one built never is.
  - A server whose pull fails is listed in C(failed_servers) with its reason (the call itself fails only when
    the registry or the push does), so that the role can fail that server by name, and that server only.
  - With C(registry) (the user's registry, e.g. C(harbor.example.com/ml)), pushes there (the controller's
    engine must be logged in) and each server pulls from it directly, over the same ssh command without a
    tunnel.
  - Every server gets the image under its local name C(image) (the registry's name is removed again), so the
    containers stage needs nothing else.
  - With C(source) (a server build, cluster_image_builder), the image is on that server's engine, not the
    controller's, and nothing of it crosses the controller's link. One ssh session to the source, which lives
    as long as the call, holds Distribution registry on the source's 127.0.0.1:C(port) (storage under
    C(storage) there, kept between runs; the call's password, the session's first line of input), the push
    into it, and an ephemeral ed25519 key (made on the
    controller for this call) authorized there for nothing but a forward to that port
    (C(restrict,port-forwarding,permitopen)). Each server lacking the image receives the private half on stdin
    into a 0700 temporary directory, opens C(ssh -N -L) to the source over the cluster's own network, the
    source's host keys pinned (read from the source over the controller's pinned login), pulls the layers it
    lacks from its own loopback, and removes key and tunnel. When the call ends (also on failure, or when the
    controller goes away) the registry stops and the key is deauthorized; nothing is left listening or
    authorized on any server.
options:
  image:
    description: The image on the controller, NAME:TAG.
    type: str
    required: true
  servers:
    description: The servers that lack it, each C(name) and C(ssh) (the argv that logs in, the target last).
    type: list
    elements: dict
    required: true
  registry:
    description: The user's registry (host[:port][/path]); empty runs one on the controller's loopback.
    type: str
    default: ""
  port:
    description: The controller's and each server's loopback port for the registry that this module runs.
    type: int
    default: 15000
  registry_command:
    description: Docker's Distribution registry (2.x) binary.
    type: str
    default: docker-registry
  storage:
    description: The registry's storage directory on the controller (kept between runs).
    type: path
    required: true
  parallel:
    description:
      - Servers pulling at the same time. Of those that tunnel to a build server, at most 8 are in their ssh
        handshakes with its sshd at once (below sshd's default MaxStartups), however many this is.
    type: int
    default: 64
  timeout:
    description: Seconds one server's pull may take; the push gets the same bound.
    type: int
    default: 1800
  source:
    description: The build server holding the image (C(name), C(ssh) as in C(servers)); empty, the controller.
    type: dict
  tiers:
    description:
      - How the servers that lack the image get it from the source (the build server with C(source), else the
        controller's registry; a user's registry serves every server itself). C(1), every one from the source.
        C(2), ceil(sqrt(L)) tier-1 servers (the first of each group of neighbours in the given order) from the
        source, each of which then runs Distribution as a pull-through cache of the source's registry
        (proxy.remoteurl, through its own tunnel to the source and a relay that logs it in; the source sends
        each layer about twice per tier-1 server) on its loopback's port + 1 for the rest of its group, which
        pull through a tunnel to its sshd (at most 8 in their handshakes with it at a time). A tier-1 server
        that cannot serve sends its group to the source, as does a pull through it that failed. C(auto), 2
        when more than 64 servers lack the image.
    type: str
    choices: [auto, "1", "2"]
    default: "1"
  cache_storage:
    description: In two tiers, the store of each tier-1 server's cache (removed when the call ends).
    type: str
    default: /var/tmp/ddp-cluster-image-cache
  source_address:
    description: The source's address as the other servers reach it (default the last word of its C(ssh)).
    type: str
    default: ""
  source_script:
    description: The source's side (the role's files/registry-source.sh).
    type: str
    default: ""
  receiver_script:
    description: Each server's side (the role's files/pull-image.sh).
    type: str
    default: ""
"""

RETURN = r"""
reference:
  description: The name pushed (REGISTRY/NAME:TAG).
  type: str
  returned: always
digest:
  description: The pushed manifest's digest, by which every server pulled (REGISTRY/NAME@DIGEST).
  type: str
  returned: when pushed
image_id:
  description: The built image's ID, which every server's pulled image had to have.
  type: str
  returned: when pushed
push_seconds:
  description: Seconds the push took.
  type: float
  returned: always
pushed_layers:
  description: Layers the push sent (the others were in the registry already).
  type: int
  returned: always
servers:
  description: Per server name, ok, rc, seconds, layers_pulled, layers_present, pulled (the reference it
    pulled), image_id (the ID it got), attempts (1 to 4), error and the output's last lines.
  type: dict
  returned: always
failed_servers:
  description: The names of the servers whose pull failed.
  type: list
  returned: always
bytes_served:
  description: Bytes of layers and manifests the controller's registry sent to the servers (0 for a user
    registry), or the build server's registry, to the servers and the tier-1 caches.
  type: int
  returned: always
tiers:
  description: In two tiers, per tier-1 server, ok, error (why it could not serve) and served (the servers
    that pulled through it); each server's C(via) in C(servers) names where it pulled from.
  type: dict
  returned: in two tiers
tier1_bytes_served:
  description: In two tiers, the bytes the tier-1 servers' caches sent (to themselves and their groups).
  type: int
  returned: in two tiers
"""

from typing import TYPE_CHECKING  # noqa: E402  (Ansible modules put DOCUMENTATION first)

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

if TYPE_CHECKING:  # the same file: module_utils/ddp_distribute.py links to the package's module
    from ddp_cluster.image.distribute import run
else:
    from ansible.module_utils.ddp_distribute import run


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "image": {"type": "str", "required": True},
            "servers": {"type": "list", "elements": "dict", "required": True},
            "registry": {"type": "str", "default": ""},
            "port": {"type": "int", "default": 15000},
            "registry_command": {"type": "str", "default": "docker-registry"},
            "storage": {"type": "path", "required": True},
            "parallel": {"type": "int", "default": 64},
            "timeout": {"type": "int", "default": 1800},
            "source": {"type": "dict"},
            "tiers": {"type": "str", "choices": ["auto", "1", "2"], "default": "1"},
            "cache_storage": {"type": "str", "default": "/var/tmp/ddp-cluster-image-cache"},
            "source_address": {"type": "str", "default": ""},
            "source_script": {"type": "str", "default": ""},
            "receiver_script": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    failed, result = run(module.params, module.check_mode)
    if failed:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
