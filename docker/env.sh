# ddp-cluster node environment: read by login shells, interactive shells and `ssh node cmd`.
# Guarded so that it is read once per shell.
if [ -z "${DDP_CLUSTER_ENV:-}" ]; then
  export DDP_CLUSTER_ENV=1
  # The base image's ENV, captured at build time: sshd's shells do not get it otherwise.
  if [ -r /etc/ddp-cluster/base.env ]; then . /etc/ddp-cluster/base.env; fi
  export PATH="/opt/venv/bin:$PATH"
  # OpenMPI from dnf/yum (openEuler, RHEL) lives outside PATH, where `module load mpi` would put it.
  if [ -x /usr/lib64/openmpi/bin/mpirun ]; then
    export PATH="$PATH:/usr/lib64/openmpi/bin" LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/lib64/openmpi/lib"
  fi
  # Containers run as root; OpenMPI refuses that unless told.
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # Settings of this cluster and node (interface, accelerator variables), written by site.yml.
  # (an if, not &&: sourcing this file ends with status 0 where there is none yet, as in an image build)
  if [ -r /etc/ddp-cluster/node/node.env ]; then . /etc/ddp-cluster/node/node.env; fi
fi
