"""``python -m bertforge`` (and ``torchrun -m bertforge``) is the ``bertforge`` command."""

import sys


def console_main() -> None:
    """The ``bertforge`` command; ``--help``, ``--version`` and no command at all answer before torch is imported
    (:mod:`bertforge.usage`)."""
    from . import usage

    if usage.answers(sys.argv[1:]):
        raise SystemExit(usage.main(sys.argv[1:]))
    from .cli import console_main as run

    run()


if __name__ == "__main__":
    console_main()
