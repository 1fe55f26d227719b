"""Errors a user can fix: each says what was wrong and how to fix it; commands print it, no traceback."""

from __future__ import annotations


class DdpClusterError(Exception):
    """Base of every error caused by a bad input (environment, flag, data file, checkpoint)."""


class DistEnvError(DdpClusterError):
    """The distributed environment variables are missing or inconsistent."""


class DeviceError(DdpClusterError):
    """The requested device or backend is not available here."""


class DatasetError(DdpClusterError):
    """A dataset file is missing or malformed."""


class CheckpointError(DdpClusterError):
    """A checkpoint is missing, truncated, corrupt or does not fit this run."""
