"""Stand-in of torch_npu (the Ascend adapter for PyTorch), for the simulated Ascend servers of ddp-cluster.

Like the real package it fails to import when the driver's libraries are not on LD_LIBRARY_PATH (the real one
dlopens libascend_hal.so and fails with this message), and it registers ``torch.npu``; the device count comes
from the /dev/davinciN nodes the container was given, narrowed by ASCEND_RT_VISIBLE_DEVICES. It has no
kernels: tensors cannot move to an "npu" device, so jobs on the simulated servers train on cpu, asked
explicitly.

Installed from its wheel (sim/cann/make-torch-npu-wheel.py), it is also torch's autoloaded device backend, as
the real one is (entry point group ``torch.backends``): ``import torch`` imports it, and fails when it fails
(TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns that off).
"""

from __future__ import annotations

import glob
import os
import types

# As the real package: autoloading switched off while torch imports (torch's autoload of this package, through
# its torch.backends entry point, would otherwise import it again half-way), restored by _autoload below.
ORG_AUTOLOAD = os.getenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

import torch  # noqa: E402

from torch_npu.version import __version__  # noqa: E402,F401

_DRIVER_LIBRARY = "libascend_hal.so"


def _library_on_path(name: str) -> str | None:
    for directory in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if directory and os.path.isfile(os.path.join(directory, name)):
            return os.path.join(directory, name)
    return None


# The real package's libraries link the driver's: its import fails here, after torch's.
if _library_on_path(_DRIVER_LIBRARY) is None:
    raise ImportError(f"{_DRIVER_LIBRARY}: cannot open shared object file: No such file or directory")


def _write_plog() -> None:
    """As CANN does: a process log under $ASCEND_PROCESS_LOG_PATH/plog (default ~/ascend/log/plog)."""
    import time

    root = os.environ.get("ASCEND_PROCESS_LOG_PATH") or os.path.join(os.path.expanduser("~"), "ascend", "log")
    directory = os.path.join(root, "plog")
    try:
        os.makedirs(directory, exist_ok=True)
        stamp = time.strftime("%Y%m%d%H%M%S")
        with open(os.path.join(directory, f"plog-{os.getpid()}_{stamp}.log"), "a", encoding="utf-8") as log:
            log.write(
                f"[INFO] ASCENDCL({os.getpid()},python):{time.strftime('%Y-%m-%d-%H:%M:%S')} "
                "torch_npu stand-in loaded\n"
            )
    except OSError:
        pass


_write_plog()


def _visible_devices() -> list[int]:
    present = sorted(int(path[len("/dev/davinci") :]) for path in glob.glob("/dev/davinci[0-9]*"))
    visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES", "").strip()
    if not visible:
        return present
    wanted = [int(item) for item in visible.split(",") if item.strip().isdigit()]
    return [index for index in wanted if index in present]


def device_count() -> int:
    return len(_visible_devices())


def is_available() -> bool:
    return device_count() > 0


npu = types.SimpleNamespace(device_count=device_count, is_available=is_available, stand_in=True)
torch.npu = npu  # type: ignore[attr-defined]
library_path = _library_on_path(_DRIVER_LIBRARY)

from torch_npu import distributed  # noqa: E402,F401  (registers parallel://, as the real package does)


def _autoload() -> None:
    """torch's entry point (group torch.backends) for this package: `import torch` imports torch_npu, which is
    all the work; like the real one it only restores the autoload switch that subprocesses inherit."""
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = ORG_AUTOLOAD


# As the real package: when `import torch_npu` comes first, torch skipped the autoload, so restore it here.
_autoload()
