# ddp-cluster node environment: read by login shells, interactive shells and `ssh node cmd`.
# Guarded so that it is read once per shell.
if [ -z "${DDP_CLUSTER_ENV:-}" ]; then
  export DDP_CLUSTER_ENV=1
  # The base image's ENV, captured at build time: sshd's shells do not get it otherwise.
  [ -r /etc/ddp-cluster/base.env ] && . /etc/ddp-cluster/base.env
  export PATH="/opt/venv/bin:$PATH"
  # Containers run as root; OpenMPI refuses that unless told.
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # Settings of this cluster and node (interface, accelerator variables), written by site.yml.
  [ -r /etc/ddp-cluster/node/node.env ] && . /etc/ddp-cluster/node/node.env
fi
