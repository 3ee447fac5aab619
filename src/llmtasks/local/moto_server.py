"""The embedded AWS endpoint: moto's server, run in its own process by `llmtasks up`.

A separate process keeps moto's request handling off the functions' interpreter lock. This
module is where the local stack adds what moto lacks, so every client sees one endpoint.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from moto.server import main as moto_main

    from llmtasks.local import moto_redrive

    moto_redrive.install()
    moto_main(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
