"""The ``rein`` command: ``rein proxy …`` (standalone inference proxy), ``rein view RUN_DIR`` (trajectory
viewer), ``rein export RUN_DIR --merged OUT`` (a full HF model; LoRA merged). Each subcommand lives with its
component; this only dispatches."""

from __future__ import annotations

import sys

SUBCOMMANDS = {
    "proxy": ("components.proxy.cli", "start the inference proxy standalone"),
    "view": ("monitoring.viewer", "write (and optionally serve) the trajectory viewer of a run directory"),
    "export": ("components.export", "write a run's newest checkpoint as a full HF model (--merged OUT)"),
}


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``rein SUBCOMMAND ARGS…`` to the subcommand's own ``main(args)``."""
    import importlib

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        lines = [f"  {name:8s} {help_text}" for name, (_, help_text) in SUBCOMMANDS.items()]
        print("usage: rein SUBCOMMAND [ARGS…]\n\nsubcommands:\n" + "\n".join(lines))
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(SUBCOMMANDS[argv[0]][0])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
