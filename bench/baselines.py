"""The simple alternatives, measured by the same script on the same machine:
a fresh `python3 -I -S` per call (result as JSON on stdout) and seed 001's design, a Node
worker thread running `vm.runInNewContext` per call (no isolation, no HTTP, no database);
and the HTTP floor: a bare FastAPI route on the same uvicorn settings as `toolkiln serve`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from client import Conn

TOOL = "def main(**params):\n    return {'message': 'ok'}\n"


def fresh_python(calls: int) -> list[float]:
    # The interpreter itself (the one the sandbox runs), not a `python3` found on PATH:
    # on a pyenv machine that is a shell-script shim costing more than the interpreter.
    python = os.path.realpath(sys.executable)
    cmd = [python, "-I", "-S", "-c", TOOL + "import json\nprint(json.dumps(main()))\n"]
    lat = []
    for _ in range(calls):
        t = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, check=True, env={})
        json.loads(out.stdout)
        lat.append((time.perf_counter() - t) * 1000)
    return lat


NODE = r"""
const { Worker } = require('node:worker_threads');
const src = `
  const { parentPort, workerData } = require('node:worker_threads');
  const vm = require('node:vm');
  const ctx = Object.create(null);
  ctx.input = JSON.parse(workerData);
  const out = vm.runInNewContext('(function main(p){ return {message: "ok"} })(input)', ctx, {timeout: 5000});
  parentPort.postMessage(JSON.stringify(out));
`;
function once() {
  return new Promise((resolve, reject) => {
    const t = process.hrtime.bigint();
    const w = new Worker(src, { eval: true, workerData: '{}' });
    w.once('message', (m) => { JSON.parse(m); resolve(Number(process.hrtime.bigint() - t) / 1e6); w.terminate(); });
    w.once('error', reject);
  });
}
(async () => {
  const seq = [];
  const n = Number(process.argv[process.argv.length - 1]);
  for (let i = 0; i < n; i++) seq.push(await once());
  console.log(JSON.stringify(seq));
})();
"""


def node_worker(calls: int) -> list[float] | None:
    node = shutil.which("node")
    if node is None:
        return None
    # node starts 2.5x slower with NODE_EXTRA_CA_CERTS set (SANDBOX-NOTES): leave it out.
    env = {k: v for k, v in os.environ.items() if k != "NODE_EXTRA_CA_CERTS"}
    out = subprocess.run(
        [node, "-e", NODE, str(calls)], capture_output=True, text=True, check=True, env=env
    )
    return list(json.loads(out.stdout))


FLOOR_APP = """
import sys, uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse
app = FastAPI()
@app.get("/ping")
def ping() -> JSONResponse:
    return JSONResponse({"status": "ok"})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            access_log=False, loop="uvloop", http="httptools")
"""


def fastapi_floor(port: int, calls: int) -> list[float]:
    """GET on a bare sync FastAPI route (one thread-pool hop, like /healthz), no middleware."""
    proc = subprocess.Popen(
        [sys.executable, "-c", FLOOR_APP, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=Path(__file__).parent,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = Conn(port)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        for _ in range(50):
            conn.call("GET", "/ping")
        lat = []
        for _ in range(calls):
            t = time.perf_counter()
            conn.call("GET", "/ping")
            lat.append((time.perf_counter() - t) * 1000)
        conn.close()
        return lat
    finally:
        proc.terminate()
        proc.wait(timeout=10)
