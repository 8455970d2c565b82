"""bertforge's command line with a corpus preparation that lasts ``SLOW_PREPARE_SECONDS`` longer: what a large
corpus takes, at a small one's cost, so that a test can make the preparation outlast a timeout by a margin
that does not depend on the host's speed.

    SLOW_PREPARE_SECONDS=8 python -m tests.slow_prepare pretrain ...     # one process, or under torchrun
"""

from __future__ import annotations

import os
import sys
import time

import bertforge.prepared as prepared
from bertforge.cli import main

_run_parts = prepared._run_parts


def _slow_run_parts(*args, **kwargs):
    time.sleep(float(os.environ["SLOW_PREPARE_SECONDS"]))
    return _run_parts(*args, **kwargs)


if __name__ == "__main__":
    prepared._run_parts = _slow_run_parts
    sys.exit(main(sys.argv[1:]))
