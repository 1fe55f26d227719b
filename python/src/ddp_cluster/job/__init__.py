"""A job on the controller: the spec every part reads, the plan, the status, the results, the report.

Runs on the controller (``spec``, ``status`` and ``results`` are read on the nodes too). May import the base
modules, ``accelerators``, ``ascend`` and ``runtime.metrics`` (the names of the files a rank writes); never
the
supervisor, a rank's training code or Ansible.
"""
