"""First code the sandbox child runs (stdlib only, `python -I -S`), before the untrusted program.

argv: <workdir> <policy json>. In order: resource limits; a private network namespace (best effort,
needs CAP_SYS_ADMIN); drop to an unprivileged uid when root (so RLIMIT_NPROC and file permissions
hold); an audit hook that refuses process creation, sockets, ctypes, signals to other processes, file
writes outside the workdir and reads outside the stdlib; then exec of workdir/solution.py.
The audit hook is defence in depth next to the OS limits, not a security boundary on its own.
"""

import json
import os
import resource
import stat
import sys

_BLOCKED_EVENTS = frozenset(
    {
        "os.system", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.startfile",
        "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill",
        "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
        "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo",
        "os.symlink", "os.link", "os.chdir", "os.chmod", "os.chown", "os.chflags", "os.lchflags",
        "os.setxattr", "os.removexattr", "os.chroot", "resource.setrlimit", "resource.prlimit",
        "sys._current_frames", "sys.settrace", "sys.setprofile",
        "gc.get_objects", "gc.get_referrers", "gc.get_referents",
        "sys.remote_exec", "mmap.__new__", "fcntl.ioctl",
    }
)  # fmt: skip
_BLOCKED_PREFIXES = ("ctypes.", "_ctypes.", "winreg.", "cpython._PySys_ClearAuditHooks")
_BLOCKED_MODULES = frozenset(
    {"ctypes", "_ctypes", "_posixsubprocess", "subprocess", "socket", "_socket", "ssl", "_ssl",
     "multiprocessing", "_multiprocessing", "pty", "mmap", "asyncio", "concurrent", "selectors"}
)  # fmt: skip
_PATH_WRITE_EVENTS = frozenset({"os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.truncate", "os.utime"})
_PATH_READ_EVENTS = frozenset({"os.listdir", "os.scandir"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_CLONE_NEWNET = 0x40000000


def _set_limits(policy):
    cpu = int(policy["cpu_time_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = int(policy["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    file_bytes = int(policy["max_file_bytes"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


def _unshare_network():
    """Enter a fresh network namespace (only a down loopback); False when not permitted here."""
    if hasattr(os, "unshare"):
        try:
            os.unshare(os.CLONE_NEWNET)
            return True
        except OSError:
            return False
    # Loaded only here: a module already loaded imports with no audit event, so the program would find it.
    import ctypes  # noqa: PLC0415 light: ctypes; the sandboxed program must not find it loaded

    libc = ctypes.CDLL(None, use_errno=True)
    ok = libc.unshare(_CLONE_NEWNET) == 0
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
        del sys.modules[name]
    return ok


def _world_readable(directory):
    """True when a user with no special rights can list `directory` and traverse all its parents."""
    path = directory
    need = stat.S_IROTH | stat.S_IXOTH
    while True:
        if os.stat(path).st_mode & need != need:
            return False
        need = stat.S_IXOTH
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def _drop_privileges(uid, stdlib_dirs):
    """Become `uid` when root, unless the stdlib would then be unreadable (python under /root)."""
    if os.geteuid() != 0 or not all(_world_readable(d) for d in stdlib_dirs):
        return False
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    return True


def _lexical(path, cwd):
    """Absolute, '.'/'..'-resolved path using only str methods (user code cannot monkeypatch them)."""
    if not path.startswith("/"):
        path = cwd + "/" + path
    parts = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
        else:
            parts.append(part)
    return "/" + "/".join(parts)


def _make_hook(workdir, read_roots, read_files):
    write_root = workdir.rstrip("/") + "/"
    read_prefixes = tuple(root.rstrip("/") + "/" for root in read_roots)
    blocked_events, blocked_prefixes, blocked_modules = _BLOCKED_EVENTS, _BLOCKED_PREFIXES, _BLOCKED_MODULES
    write_events, read_events, write_flags = _PATH_WRITE_EVENTS, _PATH_READ_EVENTS, _WRITE_FLAGS
    text_types = (str, bytes)

    def as_path(value):
        if isinstance(value, bytes):
            value = value.decode("utf-8", "surrogateescape")
        return _lexical(value, workdir) + "/"

    def deny(event, detail=""):
        raise PermissionError(f"sandbox: {event} {detail}".strip())

    def hook(event, args):
        if event in blocked_events or event.startswith(blocked_prefixes):
            deny(event)
        if event == "import":
            if str(args[0]).split(".")[0] in blocked_modules:
                deny(event, str(args[0]))
        elif event == "open":
            path, mode, flags = args[0], args[1], args[2]
            if not isinstance(path, text_types):
                return  # an already-open file descriptor
            full = as_path(path)
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags > 0 and flags & write_flags
            )
            if writing:
                if not full.startswith(write_root):
                    deny("write", full[:-1])
            elif not (full.startswith(read_prefixes) or full[:-1] in read_files):
                deny("read", full[:-1])
        elif event in write_events:
            for value in args[:2]:
                if isinstance(value, text_types) and not as_path(value).startswith(write_root):
                    deny(event, str(value))
        elif event in read_events:
            target = args[0] if args and isinstance(args[0], text_types) else None
            if target is not None and not as_path(target).startswith(read_prefixes):
                deny(event, str(target))

    return hook


def main():
    workdir, policy = sys.argv[1], json.loads(sys.argv[2])
    _set_limits(policy)
    layers = {"rlimits": True, "network_namespace": False, "unprivileged_uid": False, "audit_hook": False}
    if policy["isolate_network"]:
        layers["network_namespace"] = _unshare_network()
    stdlib = os.path.dirname(os.path.realpath(os.__file__))
    if policy["drop_privileges"]:
        dirs = [p for p in sys.path if os.path.isdir(p)]
        layers["unprivileged_uid"] = _drop_privileges(int(policy["uid"]), dirs)
    if layers["unprivileged_uid"]:
        procs = int(policy["max_processes"])
        resource.setrlimit(resource.RLIMIT_NPROC, (procs, procs))
    with open(os.path.join(workdir, "solution.py"), encoding="utf-8") as f:
        source = f.read()
    code = compile(source, "solution.py", "exec")
    if policy.get("report_layers"):
        layers["audit_hook"] = bool(policy["audit_hook"])
        sys.stderr.write("SANDBOX_LAYERS " + json.dumps(layers) + "\n")
    if policy["audit_hook"]:
        roots = (workdir, stdlib, *(os.path.realpath(p) for p in sys.path), "/usr/share/zoneinfo")
        sys.addaudithook(_make_hook(workdir, roots, frozenset({"/dev/null", "/dev/urandom", "/dev/zero"})))
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    del source
    exec(code, namespace)


if __name__ == "__main__":
    main()
