"""The health gate: ``gate`` runs on every rank (torch); ``judge`` and ``fabric`` judge on the controller.

May import the base modules, ``accelerators`` and ``runtime``; never ``job``, ``supervisor`` or Ansible.
"""
