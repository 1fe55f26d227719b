"""Ascend NPU networking: device-IP plans, HCCL rank tables, hccn_tool reads and settings, device TLS, the
kernel's reserved ports for HCCL.

Runs on the controller; ``hccn`` also ships to the servers as the hccn_network role's module_utils (standard
library only, Python 3.8). Imports only the base modules (errors, files); ``hccn`` imports nothing of the
package.
"""
