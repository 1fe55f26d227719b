"""The job's supervisor: the launcher, every node's liveness, failures and restarts, the node's jobs.

Runs in the node containers (no torch). ``loop`` (the supervisor: launcher, watch, report), ``failures``
(what failed, whether a restart cures it), ``recovery`` (the restart), ``remote`` (the other nodes over the
mesh's ssh, the stop sweep), ``liveness`` (the watch tree: lost nodes, progress ages), ``standby`` (the second
node's standby, which takes the job over when the first node is lost), ``replicas`` (checkpoint copies off
the first node, verified), ``stall`` (the progress watchdog, the ranks' stacks), ``jobs`` (which jobs run on
this node, the node's claim, a job stopped here), ``agent`` (torchrun under mpirun). May import the base
modules, ``job`` (spec, status, results, doctor, node_jobs), ``ascend`` and the torch-free names of
``runtime`` (checkpoint_names); never a rank's code, the planner or Ansible.
"""
