"""The node image: the base image as the controller sees it, the probe run inside a base, where to build.

Runs on the controller (``probe`` runs inside a base image: standard library only, Python 3.6+). Imports
only the
base modules (errors, files).
"""
