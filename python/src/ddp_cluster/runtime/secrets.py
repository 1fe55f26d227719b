"""A rank's secrets: ``JOB/secrets.json`` (the job's ``secret_env``, mode 0600 in a job directory of mode
0700) read into the rank's environment before anything else runs, so that a script reads
``os.environ["TOKEN"]`` as it would anywhere. The job's directory is ``DDP_JOB_DIR``, which the launcher
gives every rank (and torchrun's agent its workers); outside a job, or in a job without secrets, nothing
happens.

The values reach a rank through this file only: not through the launcher's command line or its environment
(:mod:`ddp_cluster.job.secrets` is the controller's and the supervisor's side).

Standard library only.
"""

from __future__ import annotations

import json
import os
from collections.abc import MutableMapping
from pathlib import Path

from ddp_cluster.errors import DdpClusterError

FILE = "secrets.json"  # ddp_cluster.job.secrets.FILE (a rank's code does not import the controller's)
JOB_DIR_VARIABLE = "DDP_JOB_DIR"


class SecretsFileError(DdpClusterError):
    """The job's secrets file exists but cannot be read as a mapping of names to values."""


def load_secrets(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Put the job's secrets into ``environ`` (this process's environment); the names set, [] when the job
    has none."""
    environ = os.environ if environ is None else environ
    job_dir = environ.get(JOB_DIR_VARIABLE, "")
    if not job_dir:
        return []
    path = Path(job_dir, FILE)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as error:
        raise SecretsFileError(
            f"the job's secrets ({path}) cannot be read: {error.strerror or error}"
        ) from error
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not all(isinstance(value, str) for value in data.values()):
        raise SecretsFileError(f"the job's secrets ({path}) are not a JSON object of names to strings")
    environ.update({str(name): value for name, value in data.items()})
    return sorted(str(name) for name in data)
