"""Action ``ddp_image_pull``: look for the base image on the engine that builds and pull a user's base there
when it lacks it, printing its progress as it goes, within a bound; on failure say why.

Arguments: ``name``; ``timeout`` (seconds, 3600); ``every`` (seconds between progress lines, 15); ``remote``
(the task is delegated to a build server: the pull runs there, read back over the task's own connection);
``pull`` (false only looks: the project's own base, which the image stage makes with debootstrap); ``where``
(the build server as the lines name it). In check mode it only says that it would pull.

The logic is ``ddp_cluster.image.pull`` (unit-tested with the package).
"""

from __future__ import annotations

import site
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

# The package as installed, else this checkout's python/src (plugins/pythonpath/ddp_cluster.pth).
site.addsitedir(str(Path(__file__).resolve().parents[1] / "pythonpath"))

from ddp_cluster.image import pull

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("name", "timeout", "every", "remote", "pull", "where"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = self._task.args
        engine = pull.There(self._shell) if boolean(args.get("remote", False), strict=True) else pull.Here()
        result.update(
            pull.find_or_pull(
                engine,
                str(args["name"]),
                timeout=int(args.get("timeout", 3600)),
                every=float(args.get("every", 15)),
                pull=boolean(args.get("pull", True), strict=True),
                check_mode=bool(self._task.check_mode),
                where=str(args.get("where", "")),
                say=display.display,
            )
        )
        return result

    def _shell(self, command: str) -> Mapping[str, Any]:
        done: Mapping[str, Any] = self._low_level_execute_command(command, sudoable=True)
        return done
