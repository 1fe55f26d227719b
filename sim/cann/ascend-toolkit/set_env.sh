# Stand-in of CANN's /usr/local/Ascend/ascend-toolkit/set_env.sh: the toolkit's variables, and its libraries
# added to LD_LIBRARY_PATH (the driver's library dirs are not: CANN images set those in ENV).
export ASCEND_TOOLKIT_HOME=/usr/local/Ascend/ascend-toolkit/latest
export ASCEND_HOME_PATH=${ASCEND_TOOLKIT_HOME}
export ASCEND_OPP_PATH=${ASCEND_TOOLKIT_HOME}/opp
export ASCEND_AICPU_PATH=${ASCEND_TOOLKIT_HOME}
export LD_LIBRARY_PATH=${ASCEND_TOOLKIT_HOME}/lib64:${ASCEND_TOOLKIT_HOME}/lib64/plugin/opskernel:${LD_LIBRARY_PATH:-}
export PATH=${ASCEND_TOOLKIT_HOME}/bin:${PATH}
