"""The controller's reading of the Ansible inventory (``hostvars``), for the playbooks' filters: where each
node is reached, how the controller's own ssh reaches a server, and the NPU device-IP plan the hosts describe.

Runs on the controller, called by plugins/filter/ddp_cluster.py (a shim). Imports the base modules and
``ascend`` (the plan's rules); nothing of the job, the supervisor, the ranks or Ansible.
"""
