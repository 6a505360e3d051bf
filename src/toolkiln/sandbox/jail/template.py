"""The template process: sets up the jail once, then forks isolated children on request.

Started by the host as ``python -I -S -B template.py CONFIG_JSON CONTROL_FD`` with an empty
environment. Steps, once per template (the expensive part, per SANDBOX-NOTES):
1. unshare mount, PID, network, IPC and UTS namespaces; fork so the worker is PID 1 of the
   new PID namespace (if it dies, the kernel kills every child in it);
2. build a new root on tmpfs with read-only binds of only what Python needs (native
   libraries, the standard library without its site-packages, the curated packages), a
   minimal noexec /dev and a size-capped, noexec /tmp, and no /proc or /sys (they show host
   paths and host-wide counters); pivot_root into it; remount read-only;
3. build the seccomp filter; pre-import the standard modules tools use most.
Then, per child (ahead of any request): fork, drop to a uid of its own, set rlimits,
no_new_privs, seccomp; hand the host a pidfd and one end of a socketpair over the control
socket (SCM_RIGHTS). The host talks to the child directly; the template reaps children and
reports how each one ended. That loop is C (_spawn.c): the template's Python, run between
two forks, wrote ~110 pages per call that its children shared, each copied
(docs/decisions/102-template-loop-and-jail-in-c.md).
"""

from __future__ import annotations

import _socket
import contextlib
import gc
import json
import os
import random
import signal
import socket
import stat
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _spawn
import child
import linux
import protocol
import pyrunner
import seccomp
from config import JailConfig

# The JavaScript runner (and asyncio with it) is imported by a JavaScript template only:
# in a Python template it made every fork copy asyncio's modules and libraries whether or
# not the template's preload asked for them (docs/decisions/104-what-the-python-template-holds.md).
jsrunner: Any = None

NEW_ROOT = "/tmp/toolkiln-root"
SCRATCH_FLAGS = linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC


def scratch_root(uid: int) -> str:
    """Where a uid's scratch tmpfs is mounted in the jail (``_spawn.c``'s ``path_of``: a
    child's scratch is a new directory in it)."""
    return f"/tmp/{uid}/s"


def scratch_options(cfg: JailConfig) -> str:
    """A uid's scratch tmpfs: root's directory (0711) with its caps in bytes and files."""
    return f"size={cfg.scratch_mb}m,nr_inodes={cfg.scratch_files},mode=0711"


def _bind_fd(fd: int, target: str, layers: dict) -> None:
    """Bind a directory, opened before /tmp was covered, read-only at target."""
    os.makedirs(target, exist_ok=True)
    try:
        linux.mount(f"/proc/self/fd/{fd}", target, None, linux.MS_BIND)
    finally:
        os.close(fd)
    flags = linux.MS_REMOUNT | linux.MS_BIND | linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV
    linux.mount(None, target, None, flags)
    layers.setdefault("binds", []).append(target)


def _build_root(cfg: JailConfig, layers: dict) -> None:
    linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)
    binds = cfg.binds  # jail path -> host path, for what must not keep its own path
    sources = {
        p: os.open(p, os.O_PATH | os.O_DIRECTORY)
        for p in [*cfg.ro_paths, cfg.packages_dir, *binds.values()]
        if os.path.isdir(p) and not os.path.islink(p)
    }
    # A private /tmp of this namespace holds the new root; the host's /tmp is untouched.
    linux.mount("tmpfs", "/tmp", "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, "size=1m,mode=0755")
    os.makedirs(NEW_ROOT)
    linux.mount("tmpfs", NEW_ROOT, "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, "size=1m,mode=0755")
    r = NEW_ROOT
    for path in cfg.ro_paths:
        if os.path.islink(path):
            os.makedirs(os.path.dirname(r + path), exist_ok=True)
            os.symlink(os.readlink(path), r + path)
        elif path in sources:
            _bind_fd(sources.pop(path), r + path, layers)
    _bind_fd(sources.pop(cfg.packages_dir), r + "/pkgs", layers)
    for target, source in binds.items():
        _bind_fd(sources.pop(source), r + target, layers)
    for path in cfg.hidden:
        # Host packages beside the standard library: an empty read-only mount over each.
        if os.path.isdir(r + path):
            ro = linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
            linux.mount("tmpfs", r + path, "tmpfs", ro, "size=4k,mode=0555")
            layers.setdefault("hidden", []).append(path)
    os.makedirs(r + "/dev")
    nodev = linux.MS_NOSUID | linux.MS_NOEXEC
    linux.mount("tmpfs", r + "/dev", "tmpfs", nodev, "size=64k,mode=0755")
    for dev in ("null", "zero", "random", "urandom"):
        open(f"{r}/dev/{dev}", "a").close()
        linux.mount(f"/dev/{dev}", f"{r}/dev/{dev}", None, linux.MS_BIND)
        # A bind keeps the host mount's flags: noexec here too, so no device maps executable.
        linux.mount(None, f"{r}/dev/{dev}", None, linux.MS_REMOUNT | linux.MS_BIND | nodev)
    os.makedirs(r + "/tmp")
    # Only mount points: each uid's scratch is a tmpfs of its own (caps per call, as one uid
    # serves one call at a time), made once here; a call's directory inside it is new (spawn).
    linux.mount("tmpfs", r + "/tmp", "tmpfs", SCRATCH_FLAGS, "size=64k,mode=0711")
    # The tmpfs sits one level down, in /tmp/<uid> (root's, 0710, the uid's group): only
    # that uid can reach it. Mounted at /tmp/<uid> itself, any child could statvfs and stat
    # another uid's scratch, and so watch another workspace's running call: bytes and files
    # written, when last (tests/security/test_scratch_privacy.py).
    base = cfg.uid_base
    for uid in range(base, base + cfg.uid_count):
        os.mkdir(f"{r}/tmp/{uid}")
        os.chown(f"{r}/tmp/{uid}", 0, uid)
        os.chmod(f"{r}/tmp/{uid}", 0o710)  # noqa: S103 (the uid's group may only pass)
        os.mkdir(r + scratch_root(uid), 0o711)
        linux.mount("tmpfs", r + scratch_root(uid), "tmpfs", SCRATCH_FLAGS, scratch_options(cfg))
    os.makedirs(r + "/etc")
    os.makedirs(r + "/.old")
    os.chdir(r)
    linux.pivot_root(".", ".old")
    os.chdir("/")
    linux.umount2("/.old", linux.MNT_DETACH)
    os.rmdir("/.old")
    linux.mount(
        None, "/", None, linux.MS_REMOUNT | linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV
    )
    layers["readonly_root"] = True


def _setup(cfg: JailConfig, ctl: socket.socket) -> dict:
    """Every layer that fails is either fatal (strict) or reported as off (insecure mode)."""
    layers: dict = {"namespaces": []}
    problems: list[tuple[str, str]] = []  # (layer, what went wrong): config.LAYERS
    flags = {
        "mount": linux.CLONE_NEWNS,
        "pid": linux.CLONE_NEWPID,
        "network": linux.CLONE_NEWNET,
        "ipc": linux.CLONE_NEWIPC,
        "uts": linux.CLONE_NEWUTS,
    }
    for name, flag in flags.items():
        try:
            linux.unshare(flag)
            layers["namespaces"].append(name)
        except OSError as exc:
            problems.append(("namespaces", f"{name} namespace: {exc}"))
    if "pid" in layers["namespaces"]:
        pid = os.fork()
        if pid:
            # The outer process only waits: the worker below is PID 1 of the namespace.
            ctl.close()
            _, status = os.waitpid(pid, 0)
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
        linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
    if "uts" in layers["namespaces"]:
        socket.sethostname("sandbox")
    if "mount" in layers["namespaces"]:
        try:
            _build_root(cfg, layers)
        except OSError as exc:
            problems.append(("readonly_root", f"read-only root: {exc}"))
    else:
        problems.append(("readonly_root", "read-only root: needs a mount namespace"))
    own = None
    try:
        layers["seccomp"] = "allowlist"
        if cfg.javascript:
            installer = seccomp.Installer()  # a worker installs the whole allowlist itself
        else:
            # A Python child would make the kernel compile the whole allowlist again (~0.2 ms
            # of CPU per call): the template installs most of it once for itself and its
            # children inherit that part; each child adds only the rules for what the
            # template needs beyond the allowlist (seccomp.split_filter says why the two
            # together are exactly the allowlist).
            template_part, child_part = seccomp.split_filter()
            own, installer = seccomp.Installer(template_part), seccomp.Installer(child_part)
    except (OSError, RuntimeError) as exc:
        problems.append(("seccomp", f"seccomp: {exc}"))
        problems.append(("no_new_privs", f"set with the seccomp filter: {exc}"))
        installer = None
        layers["seccomp"] = None
    layers["uid"] = "per-call unprivileged uid" if os.geteuid() == 0 else None
    if os.geteuid() != 0:
        problems.append(("uid", "dropping to an unprivileged uid needs root in the template"))
    layers["rlimits"] = True
    layers["no_new_privs"] = installer is not None
    return {"layers": layers, "problems": problems, "installer": installer, "own": own}


class Template:
    """What the template does between two children is _spawn.c's (a C loop, so that the
    template writes few pages its children share); this class holds what runs in Python:
    a new child's start, and emptying a scratch directory a child left files in."""

    def __init__(
        self,
        cfg: JailConfig,
        ctl: socket.socket,
        installer: seccomp.Installer | None,
        own_tmp: bool = True,
    ) -> None:
        self.cfg = cfg
        self.ctl = ctl
        self.installer = installer
        # /tmp is the jail's own (the new root was built): a tmpfs per uid (_build_root),
        # a new directory per child in it. Else (insecure mode without a mount namespace)
        # it is the host's, a directory per uid.
        self.own_tmp = own_tmp
        self.javascript = cfg.javascript

    def loop(self) -> None:
        """Make, hand over and reap children until the host stops (or goes); in a new
        child, become the child and serve its one request (never returns there)."""
        # The only signal with a Python handler is SIGINT's (CPython's): back to the
        # default, so that it ends the template as before, rather than being left pending
        # by the C loop for every child forked after it to raise at its first line.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        made = _spawn.serve(
            ctl=self.ctl.fileno(),
            uid_base=self.cfg.uid_base,
            uid_count=self.cfg.uid_count,
            warm=self.cfg.warm,
            javascript=self.javascript,
            own_tmp=self.own_tmp,
            warm_nice=self.cfg.warm_nice,
            limits=child.limits(self.cfg),  # once: the template's CPUs are its children's
            drop=os.geteuid() == 0,
            seccomp=self.installer.program if self.installer is not None else None,
            spawn=protocol.SPAWN,
            stop=protocol.STOP,
            prepare=_plain_scratch,
            empty=self.empty if self.own_tmp else _remove_plain,
        )
        if made is not None:
            self._child(*made)

    def _child(self, uid: int, scratch: str, fd: int) -> None:
        try:
            if not self.javascript:
                random.seed()  # forked without CPython's after-fork hooks (_spawn.c)
            # Named, so that the socket module does not ask the kernel what it is.
            child_end = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM, 0, fd)
            child.become(scratch)
            if self.javascript:
                jsrunner.serve(child_end, self.cfg, _mini_racer, pyrunner._Link)
            else:
                pyrunner.serve(child_end, self.cfg)
        finally:
            os._exit(70)

    def empty(self, uid: int, scratch: str) -> bool:
        """Nothing of a reaped child stays in its uid's tmpfs. Most tools leave no file:
        _spawn.c's one rmdir. Else (here) the tmpfs is detached and a new one mounted in its
        place (~0.5 ms, and the kernel frees what it held: at most its cap of files, ~20 ms
        for 8,192); a descriptor another process kept open then names a tree no path
        reaches. Only if that fails, a walk that cannot raise or recurse empties it. Returns
        whether anything stays (the uid then serves no call; _spawn.c calls this again for
        it once a second until nothing does)."""
        root = scratch_root(uid)
        with contextlib.suppress(OSError):  # not mounted: an earlier mount here failed
            linux.umount2(root, linux.MNT_DETACH)
        try:
            _uid_root(root)
            linux.mount("tmpfs", root, "tmpfs", SCRATCH_FLAGS, scratch_options(self.cfg))
            return False
        except OSError:
            pass
        remove_tree(root)  # no tmpfs there now: the walk may remove root itself
        try:
            _uid_root(root)
            return bool(os.listdir(root))
        except OSError:
            return True


def _uid_root(root: str) -> None:
    """A uid's scratch root, root's own and 0711, made again if a walk removed it (a uid
    without it would stay dirty for good)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(root, 0o711)


def _remove_plain(uid: int, scratch: str) -> bool:
    """Insecure mode: a reaped child's directory in the host's /tmp goes; whether anything
    of it stays (a walk that stopped: the uid then serves no call until it is gone)."""
    remove_tree(scratch)
    return os.path.lexists(scratch)


def _plain_scratch(uid: int, path: str) -> None:
    """Insecure mode without a mount namespace: a directory in the host's /tmp, no caps."""
    remove_tree(path)
    os.mkdir(path, 0o700)
    if os.geteuid() == 0:
        os.chown(path, uid, uid)


WALK_STEPS = 50_000  # directories a removal visits at most (a full tmpfs: ~8k files, ~16k)


def _here() -> tuple[int, int]:
    st = os.stat(".")
    return st.st_dev, st.st_ino


def remove_tree(path: str) -> None:
    """Remove what is under ``path`` (and ``path`` itself unless it is a mount point),
    without recursion and without raising: whatever a child left, however deep (past
    PATH_MAX too: it walks with chdir and names, never long paths), ends no template. Links
    are removed, never followed. Each chdir is checked to land where it was meant to (the
    directory seen before going down, the one left on the way up): a process of another uid
    that renames or swaps directories while it runs (in a directory their owner opened to
    all) makes it stop, never walk elsewhere; it stops after WALK_STEPS directories too."""
    try:
        # The path itself is not followed either: in insecure mode it is a name in the
        # host's /tmp, which a tool can replace with a link (to /etc, say) while it runs.
        top = os.lstat(path)
        if not stat.S_ISDIR(top.st_mode):
            os.unlink(path)
            return
        os.chdir(path)
    except OSError:
        return
    if _here() != (top.st_dev, top.st_ino):
        with contextlib.suppress(OSError):
            os.chdir("/")
        return  # swapped between the two: not the directory it saw
    trail: list[tuple[str, tuple[int, int]]] = []  # (name entered, the directory above it)
    stuck: list[set[str]] = [set()]  # per level, directories that could not be removed
    try:
        for _ in range(WALK_STEPS):
            try:
                with os.scandir(".") as it:
                    entries = list(it)
            except OSError:
                entries = []
            below = next(
                (e for e in entries if e.is_dir(follow_symlinks=False) and e.name not in stuck[-1]),
                None,
            )
            if below is not None:
                above = _here()
                seen = below.stat(follow_symlinks=False)
                try:
                    os.chdir(below.name)
                except OSError:
                    stuck[-1].add(below.name)
                    continue
                if _here() != (seen.st_dev, seen.st_ino):
                    return  # not the directory it listed: stop
                trail.append((below.name, above))
                stuck.append(set())
                continue
            for entry in entries:
                if not entry.is_dir(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.name)
            if not trail:
                with contextlib.suppress(OSError):
                    os.chdir("/")
                    os.rmdir(path)
                return
            name, above = trail.pop()
            os.chdir("..")
            if _here() != above:
                return  # moved meanwhile: stop rather than walk what is above
            stuck.pop()
            try:
                os.rmdir(name)
            except OSError:
                stuck[-1].add(name)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            os.chdir("/")


_mini_racer = None


def _start_v8() -> None:
    """V8 started once, in the template, before any tool byte: every worker inherits a
    started engine (its flags, snapshot and ICU data read, libffi's closure pool warmed) and
    makes only its own isolates. Started in each worker instead, it cost ~68 ms of CPU per
    worker (V8 ~40, the warm-up ~28), ~1.4 ms per call at RECYCLE_AFTER calls a worker; a
    forked worker's first isolate ~9-12 ms, measured outside the jail
    (docs/decisions/114-v8-started-in-the-template.md). Nothing of it runs after the fork but what a
    worker calls itself: single-threaded V8 leaves no thread behind (a test counts the template's
    threads), and the isolate of the warm-up is closed."""
    _mini_racer.init_mini_racer(flags=("--single-threaded", "--jitless"))  # type: ignore[union-attr]
    jsrunner.preload(_mini_racer)


def main() -> None:
    global _mini_racer, jsrunner
    cfg = JailConfig.from_json(sys.argv[1])
    ctl = socket.socket(fileno=int(sys.argv[2]))
    # Descriptor 2 is the host's pipe until the hello: what set-up writes there (a failed
    # import, say) tells the host why it ended. From the hello on it is /dev/null, so that
    # nothing the template or a child writes there waits for a reader
    # (tests/sandbox/test_template_start.py; docs/decisions/403-a-templates-stderr.md).
    quiet = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    # What the template was started with names host paths (the repository, the venv, the
    # data directory) and holds its whole configuration; every child would show it to the
    # tool as sys.argv, sys.orig_argv and sys.executable: none of them is kept
    # (tests/security/test_jail_surface.py).
    sys.argv, sys.orig_argv = [""], []
    sys.executable = sys._base_executable = ""  # type: ignore[attr-defined]
    if cfg.javascript:
        with pyrunner.without_ssl():  # jsrunner imports asyncio
            import jsrunner as js

        jsrunner = js
    # The Python template for code that says async preloads asyncio too (runner.py).
    python_preload = pyrunner.ASYNC_PRELOAD if cfg.asyncio else pyrunner.PRELOAD
    pyrunner.preload(list(cfg.preload) or python_preload)
    heap = linux.anonymous_ranges()  # before the new root hides /proc
    notes: list[str] = []  # for the host's log: what went wrong but is not a problem
    state = _setup(cfg, ctl)
    if cfg.javascript:
        # Imported from inside the new root (where the engine is bound at /engine), so the
        # engine finds its library and ICU data there.
        jailed = os.path.isdir("/engine/py_mini_racer")
        sys.path.insert(0, "/engine" if jailed else cfg.js_engine_parent)
        import py_mini_racer

        _mini_racer = py_mini_racer
        _start_v8()
    else:
        pyrunner.jail_paths(cfg)
        if cfg.warm_up:
            try:
                pyrunner.rehearse(cfg)  # the runner's code quickened once, not in every child
            except Exception as exc:  # a speed-up only: the children then do it themselves
                notes.append(f"the rehearsal failed, children warm up alone: {exc!r}"[:500])
    child.prepare()
    # Children are short-lived forks: keep the collector from walking (and so copying)
    # every inherited object page.
    gc.collect()
    gc.freeze()
    if not cfg.javascript:
        # What every fork copies: the heap's page-table entries. Made of 2 MiB folios, they
        # are copied in batches (the template's own writes split the huge mappings at once,
        # the folios stay): template tree CPU -0.1 to -0.2 ms per call when it was larger
        # (docs/decisions/104-what-the-python-template-holds.md). Its heap now holds a whole aligned
        # 2 MiB stretch only when the address layout puts one there, and calls measure alike without
        # it.
        linux.collapse(heap)
    if state["own"] is not None:
        try:
            state["own"].install()  # last: from here on the template itself is filtered too
        except OSError as exc:
            state["problems"].append(("seccomp", f"seccomp: {exc}"))
            state["problems"].append(("no_new_privs", f"set with the seccomp filter: {exc}"))
            state["installer"] = None
            state["layers"]["seccomp"] = None
    refused = [p for p in state["problems"] if p[0] not in cfg.accept]
    hello = {"op": "hello", "layers": state["layers"], "problems": state["problems"]}
    if notes:
        hello["notes"] = notes
    ctl.send(json.dumps(hello).encode())
    os.dup2(quiet, 2)
    os.close(quiet)
    if refused and cfg.strict:
        sys.exit(3)
    own_tmp = bool(state["layers"].get("readonly_root"))
    Template(cfg, ctl, state["installer"], own_tmp).loop()


if __name__ == "__main__":
    main()
