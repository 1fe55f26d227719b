"""The first node's supervisor: the launcher, every node's liveness, failures and restarts, the node's jobs.

Runs in the node containers (no torch). ``loop`` (the supervisor: launcher, watch, report), ``failures``
(what failed, whether a restart cures it), ``recovery`` (the restart), ``remote`` (the other nodes over the
mesh's ssh, the stop sweep), ``liveness`` (the watch tree), ``jobs`` (which jobs run on this node, a job
stopped here), ``agent`` (torchrun under mpirun). May import the base modules, ``job`` (spec, status,
results, doctor, node_jobs), ``ascend`` and the torch-free names of ``runtime`` (checkpoint_names); never a
rank's code, the planner or Ansible.
"""
