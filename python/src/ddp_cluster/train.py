"""``python -m ddp_cluster.train``: the DDP training entrypoint (:mod:`ddp_cluster.runtime.train`)."""

import sys

try:
    from ddp_cluster.runtime.train import main
except ImportError as missing:  # a machine without torch (the controller): one line, not a traceback
    if __name__ != "__main__":
        raise
    if {"-h", "--help"} & set(sys.argv[1:]):  # the options read without torch (their choices included)
        import ast
        import importlib.util
        from pathlib import Path

        from ddp_cluster.runtime.config import parse_args
        from ddp_cluster.text import plain

        spec = importlib.util.find_spec("ddp_cluster.runtime.train")
        source = Path(spec.origin).read_text(encoding="utf-8") if spec and spec.origin else ""
        parse_args(sys.argv[1:], description=plain(ast.get_docstring(ast.parse(source)) or ""))
    print(
        f"python -m ddp_cluster.train: {missing}; its options are in docs/jobs.md"
        " (Training: python -m ddp_cluster.train)",
        file=sys.stderr,
    )
    raise SystemExit(1) from None

from ddp_cluster.runtime.finish import exit_process

__all__ = ["main"]

if __name__ == "__main__":
    exit_process(main())  # no interpreter finalization after the collectives (see ddp_cluster.runtime.finish)
