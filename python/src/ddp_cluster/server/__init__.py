"""What runs in a server's own Python (standard library only, Python 3.8): shipped as the roles' module_utils.

Imports nothing of the package: a module here travels alone.
"""
