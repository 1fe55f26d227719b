#!/bin/bash
# ddp-sim stand-in of NGC's /opt/nvidia/nvidia_entrypoint.sh: the container banner on stdout (as NVIDIA's does, on
# every `docker run`), then the command, or an interactive bash when there is none.
cat <<BANNER

=============
== PyTorch ==
=============

NVIDIA Release ${NVIDIA_PYTORCH_VERSION:-} (ddp-cluster stand-in)
PyTorch Version ${PYTORCH_VERSION:-}

This container image and its contents are governed by the NVIDIA Deep Learning Container License.
By pulling and using the container, you accept the terms and conditions of this license:
https://developer.nvidia.com/ngc/nvidia-deep-learning-container-license
BANNER
if [[ ! -e /proc/driver/nvidia/version ]]; then
  echo
  echo "WARNING: The NVIDIA Driver was not detected.  GPU functionality will not be available."
  echo "   Use the NVIDIA Container Toolkit to start this container with GPU support; see"
  echo "   https://docs.nvidia.com/datacenter/cloud-native/ ."
fi
echo

if [[ $# -eq 0 ]]; then
  exec /bin/bash
else
  exec "$@"
fi
