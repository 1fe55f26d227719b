"""A package, so that its conftest.py is the module sim.conftest, which the stages' files take their helpers
from, and tests/conftest.py stays the module conftest, which they take run_playbook and the rest from."""
