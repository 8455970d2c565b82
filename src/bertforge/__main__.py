"""``python -m bertforge`` (and ``torchrun -m bertforge``) is the ``bertforge`` command."""

import sys


def console_main() -> None:
    """The ``bertforge`` command; ``--version`` answers before torch is imported."""
    if sys.argv[1:] == ["--version"]:
        from . import __version__

        print(f"bertforge {__version__}")
        return
    from .cli import console_main as run

    run()


if __name__ == "__main__":
    console_main()
