#!/bin/sh
# Dress a simulated server as an Atlas training server, without the chips: the driver tree with its version
# files, /etc/ascend_install.info, the davinci device nodes, and the npu-smi / hccn_tool test doubles at the
# paths the vendor's packages use. Run at every boot (device nodes live on /dev, which a restart empties).
set -eu

src=/opt/ddp-sim/ascend
driver=/usr/local/Ascend/driver

mkdir -p "$driver/lib64/driver" "$driver/lib64/common" "$driver/tools" /usr/local/Ascend/firmware /usr/local/dcmi \
  /var/lib/ddp-doubles
cp "$src/driver-version.info" "$driver/version.info"
cp "$src/firmware-version.info" /usr/local/Ascend/firmware/version.info
cp "$src/ascend_install.info" /etc/ascend_install.info
# Stand-ins of the driver libraries the torch_npu stand-in looks for on LD_LIBRARY_PATH (no code inside).
for lib in driver/libascend_hal.so driver/libdrvdsmi_host.so common/libc_sec.so common/libmmpa.so; do
  [ -e "$driver/lib64/$lib" ] || echo "ddp-sim stand-in of $lib" > "$driver/lib64/$lib"
done
[ -e /usr/local/dcmi/dcmi_interface_api.h ] || echo "/* ddp-sim stand-in */" > /usr/local/dcmi/dcmi_interface_api.h
install -m 0755 /opt/ddp-sim/doubles/hccn_tool "$driver/tools/hccn_tool"
install -m 0755 /opt/ddp-sim/doubles/npu-smi /usr/local/sbin/npu-smi
# npu-smi info -t topo's CPU Affinity: this machine's CPUs for every chip (one NUMA node), so that jobs bound by
# cluster_cpu_binding=numa run; the real layout (144-167, ...) names CPUs this machine does not have.
cpus=$(cat /sys/devices/system/cpu/online 2>/dev/null || echo 0)
[ -e /var/lib/ddp-doubles/config.json ] || python3 - "$cpus" > /var/lib/ddp-doubles/config.json <<'PY'
import json, sys
devices = {str(index): {"cpu_affinity": sys.argv[1]} for index in range(8)}
print(json.dumps({"chip_count": 8, "npu_name": "910B", "version": "23.0.0", "devices": devices}))
PY

# Character devices with the names the driver creates (majors from the dynamic range; nothing opens them).
for index in 0 1 2 3 4 5 6 7; do
  [ -e "/dev/davinci$index" ] || mknod -m 0666 "/dev/davinci$index" c 236 "$index"
done
[ -e /dev/davinci_manager ] || mknod -m 0666 /dev/davinci_manager c 237 0
[ -e /dev/devmm_svm ] || mknod -m 0666 /dev/devmm_svm c 238 0
[ -e /dev/hisi_hdc ] || mknod -m 0666 /dev/hisi_hdc c 239 0

# ascend-docker-runtime, installed but not registered with the engine (sim/ascend/install-runtime.sh does that,
# on the servers a test picks).
install -D -m 0755 /opt/ddp-sim/ascend/ascend-docker-runtime /usr/local/Ascend/Ascend-Docker-Runtime/ascend-docker-runtime
install -D -m 0644 /opt/ddp-sim/ascend/base.list /etc/ascend-docker-runtime.d/base.list
mkdir -p /var/queue_schedule
