"""A job on the controller: its request, spec, plan, bundle, status, results, report, and its lifecycle.

Runs on the controller (``spec``, ``status`` and ``results`` are read on the nodes too). ``request`` checks a
request against the role's argument_specs, ``records`` reads the nodes' records, ``plan`` makes the JobSpec,
``bundle`` writes the files every node unpacks, ``control`` starts, waits, detaches, attaches and stops a job
behind ``transport``. May import the base modules, ``accelerators``, ``ascend`` and the rank's torch-free
names (``runtime.metrics``, ``runtime.distenv``, ``runtime.checkpoint_names``); never the supervisor, a rank's
torch code or Ansible.
"""
