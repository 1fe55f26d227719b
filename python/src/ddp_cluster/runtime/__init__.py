"""Every rank of a job (torch): the training loop, its config and CLI, resume, dist env, device, checkpoints,
data.

May import the base modules and ``accelerators``; never ``job``, ``supervisor``, ``image``, ``health`` or
Ansible. ``metrics``, ``checkpoint_names``, ``cliargs`` and ``distenv`` import no torch (the controller and
the supervisor read them); ``train``, ``config``, ``resume``, ``device``, ``data``, ``models`` and ``group``
need torch.
"""
