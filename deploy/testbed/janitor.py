"""`python -m prime_swarm.deploy.testbed.janitor TAG`: waits for end of file on stdin, then
tears the testbed down (net.teardown).

The testbed's owner holds the other end of the pipe. However the owner ends (returns, raises,
or is SIGKILLed, which no `finally` sees), the kernel closes its end and the janitor cleans up.
It runs in a session of its own, so a Ctrl-C to the owner's terminal does not stop it first.
"""

from __future__ import annotations

import signal
import sys

from .net import teardown


def main() -> int:
    tag = sys.argv[1]
    # The owner's terminal closing must not stop the one process that cleans up after it.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):
        pass
    teardown(tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
