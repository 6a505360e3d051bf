"""Run by test_name_lookups.py inside a mount namespace of its own, where /etc/resolv.conf
names a nameserver that never answers and /etc/hosts lacks this host's name: a service of
its own calls built-ins whose peers have to be looked up, and prints what each call gave
and how long it took (one JSON line). Not a test module itself."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from tests.builtins.conftest import make_service
from tests.builtins.test_deadline import SEARCH_PY, SEND_PY

TIMEOUT_MS = 2000


def main() -> None:
    smtp_url, search_url = sys.argv[1], sys.argv[2]
    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for svc in make_service(
            Path(tmp), smtp_url=smtp_url, search_provider="searxng", search_url=search_url
        ):
            svc.policy(email_allowlist=["example.org"])
            for name, code in (("mail", SEND_PY), ("search", SEARCH_PY)):
                tool = svc.tool(name, code, timeout_ms=TIMEOUT_MS)
                started = time.monotonic()
                res = svc.invoke(tool)
                out[name] = {"wall_ms": (time.monotonic() - started) * 1000, "result": res}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
