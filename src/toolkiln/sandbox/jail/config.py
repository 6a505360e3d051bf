"""One template's configuration: what the host decides and the jail is built from.

Both sides load this one module, as they do ``protocol.py``: the host as
``toolkiln.sandbox.jail.config`` makes a ``JailConfig`` and starts the template with its JSON
(the template's first argument); the template loads it by path with ``JailConfig.from_json``.
Standard library only. A field the other side does not know is an error at start, never a
key silently ignored.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

PYTHON = "python"
JAVASCRIPT = "javascript"
# The isolation layers by name (the host's sandbox/layers.py says what each is and how a host
# gives it): a template reports each one it could not set up under one of these.
LAYERS = (
    "namespaces",
    "readonly_root",
    "seccomp",
    "no_new_privs",
    "uid",
    "rlimits",
    "cgroup",
    "runner_uid",  # the runner's own: the embedded runner of a host-root API (userns.py)
)


@dataclass(frozen=True, slots=True)
class JailConfig:
    """Everything a template and its children are made with (docs/security.md lists the
    limits). Tuples and dicts of strings only, so it is plain JSON both ways."""

    runtime: str  # PYTHON or JAVASCRIPT
    # The jail's file system: read-only binds of the host paths it needs, the curated
    # packages at /pkgs, empty mounts over host packages beside the standard library, and
    # jail path -> host path binds for what must not keep its own path (the JS engine).
    ro_paths: tuple[str, ...]
    packages_dir: str
    stdlib_paths: tuple[str, ...]
    hidden: tuple[str, ...] = ()
    binds: dict[str, str] = field(default_factory=dict)
    # A uid's scratch tmpfs (one uid serves one call at a time).
    scratch_mb: int = 64
    scratch_files: int = 8192
    # The uids of this template's children: a range of the host's that no other sandbox uses.
    uid_base: int = 0
    uid_count: int = 0
    warm: int = 1  # children kept ready
    warm_nice: int = 0  # the nice value a child is made and warmed at
    # A Python child serves one call: its replacement is asked for by the pool's reader when
    # its end is reported (pool.py). A JavaScript worker's successor is asked for when it
    # retires.
    replace_on_exit: bool = False
    # A Python child warms up outside its slot's CPU group and enters it when taken.
    cpu_when_taken: bool = False
    # rlimits of each child
    max_cpu_s: int = 31
    worker_cpu_s: int = 0  # a JavaScript worker's RLIMIT_CPU, for its whole life (0: max_cpu_s)
    address_space_mb: int = 768
    max_threads: int = 16
    max_open_files: int = 64
    max_file_mb: int = 16
    # protocol.Caps, as the jail enforces them on what it reads and writes
    max_log_bytes: int = 64 * 1024
    max_result_bytes: int = 1024 * 1024
    max_request_bytes: int = 4096 * 1024
    max_reply_bytes: int = 1024 * 1024
    curated: dict[str, str] = field(default_factory=dict)  # import name -> distribution
    asyncio: bool = False  # the Python template for code that says async preloads asyncio
    preload: tuple[str, ...] = ()  # modules the template imports (empty: the runtime's own)
    warm_up: bool = True  # children rehearse a call before they are handed out
    strict: bool = True  # a layer that cannot be set up stops the template
    accept: tuple[str, ...] = ()  # ... unless it is one of these (LAYERS)
    # JavaScript
    js_heap_mb: int = 128
    js_listed: tuple[str, ...] = ()  # package names a require of which is answered
    js_engine_parent: str = ""  # the engine's host directory, used only without a jail

    @property
    def javascript(self) -> bool:
        return self.runtime == JAVASCRIPT

    def replace(self, **changes: Any) -> JailConfig:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> JailConfig:
        raw = json.loads(text)
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise ValueError(f"unknown configuration fields: {', '.join(unknown)}")
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
        return cls(**values)
