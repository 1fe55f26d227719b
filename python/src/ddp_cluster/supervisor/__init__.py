"""The first node's supervisor: the launcher, every node's liveness, failures and restarts, the node's jobs.

Runs in the node containers (no torch). May import the base modules, ``job`` (spec, status, results),
``ascend``;
never ``runtime`` (the ranks' code) or Ansible.
"""
