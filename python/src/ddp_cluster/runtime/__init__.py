"""Every rank of a job (torch): the training loop, its config and CLI, dist env, device, checkpoints, data.

May import the base modules and ``accelerators``; never ``job``, ``supervisor``, ``image``, ``health`` or
Ansible.
``metrics``, ``checkpoint`` (names) and ``distenv`` import no torch.
"""
