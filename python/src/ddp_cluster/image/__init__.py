"""The node image: the base image as the controller sees it (``base``), the probe run inside a base
(``probe``), where the image is built (``builder``), its tag (``tree``), the user's base pulled onto the
engine that builds (``pull``), and the image shipped to the servers through a registry (``distribute``).

Runs on the controller and imports only the base modules (errors, files). Two modules travel alone and
import nothing of the package: ``probe`` runs inside a base image (standard library, Python 3.6 syntax) and
``distribute`` is the role's module_utils (standard library, Python 3.8).
"""
