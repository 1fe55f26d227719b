#!/bin/bash
# ddp-sim stand-in of CANN NNAL's /usr/local/Ascend/nnal/atb/set_env.sh (the 8.2.RC1 file itself was not
# available; this follows the logic of the set_env.sh Ascend publishes with ascend-transformer-boost): the C++
# ABI directory comes from --cxx_abi=0|1, else from the torch that python3 imports (cxx_abi_1 when there is
# none), then ATB's library, binary and tuning variables (the names and values CANN's Dockerfile copies into ENV).
cxx_abi=""
for option in "$@"; do
    case "$option" in
        --cxx_abi=0) cxx_abi=0 ;;
        --cxx_abi=1) cxx_abi=1 ;;
    esac
done
if [[ -z "$cxx_abi" ]]; then
    if ! python3 -c "import torch" >/dev/null 2>&1; then
        cxx_abi=1
    elif [[ $(python3 -c 'import torch; print(torch.compiled_with_cxx11_abi())' 2>/dev/null) == "True" ]]; then
        cxx_abi=1
    else
        cxx_abi=0
    fi
fi
atb_path=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/latest/atb
export ATB_HOME_PATH=${atb_path}/cxx_abi_${cxx_abi}
export LD_LIBRARY_PATH=$ATB_HOME_PATH/lib:$ATB_HOME_PATH/examples:$ATB_HOME_PATH/tests/atbopstest:$LD_LIBRARY_PATH
export PATH=$ATB_HOME_PATH/bin:$PATH
export ATB_STREAM_SYNC_EVERY_KERNEL_ENABLE=0
export ATB_STREAM_SYNC_EVERY_RUNNER_ENABLE=0
export ATB_STREAM_SYNC_EVERY_OPERATION_ENABLE=0
export ATB_OPSRUNNER_SETUP_CACHE_ENABLE=1
export ATB_OPSRUNNER_KERNEL_CACHE_LOCAL_COUNT=1
export ATB_OPSRUNNER_KERNEL_CACHE_GLOABL_COUNT=5
export ATB_WORKSPACE_MEM_ALLOC_ALG_TYPE=1
export ATB_WORKSPACE_MEM_ALLOC_GLOBAL=0
export ATB_COMPARE_TILING_EVERY_KERNEL=0
export ATB_HOST_TILING_BUFFER_BLOCK_NUM=128
export ATB_DEVICE_TILING_BUFFER_BLOCK_NUM=32
export ATB_SHARE_MEMORY_NAME_SUFFIX=""
export ATB_MATMUL_SHUFFLE_K_ENABLE=1
export ASDOPS_LOG_LEVEL=ERROR
export ASDOPS_LOG_TO_STDOUT=0
export ASDOPS_LOG_TO_FILE=1
export ASDOPS_LOG_TO_FILE_FLUSH=0
export ASDOPS_LOG_TO_BOOST_TYPE=atb
export ASDOPS_LOG_PATH=/root
export LCCL_DETERMINISTIC=0
export LCCL_PARALLEL=0
