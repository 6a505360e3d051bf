"""``python -m toolkiln ...``: the ``toolkiln`` command (``runner`` without the API's imports)."""

from __future__ import annotations

import sys


def main() -> int:
    if sys.argv[1:2] == ["runner"]:
        from toolkiln.cli.runner import main as runner

        return runner(sys.argv[2:])
    from toolkiln.cli.main import main as toolkiln

    return toolkiln()


if __name__ == "__main__":
    raise SystemExit(main())
