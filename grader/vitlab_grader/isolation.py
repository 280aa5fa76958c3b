"""Run one graded submission in isolation: its own folder, a scrubbed environment, a sandbox.

Usage (the grader, one submission)::

    from nbclient import NotebookClient
    from vitlab_grader.isolation import (
        end_processes, isolated_kernel_manager, scrubbed_env, submission_folder,
    )

    with submission_folder({"09_pit.ipynb": data}) as folder:  # only these files
        km, isolation = isolated_kernel_manager(folder, scrubbed_env({"VITLAB_CHECK_DATA": "1"}))
        try:
            client = NotebookClient(notebook, km=km, kernel_name="python3", shutdown_kernel="immediate", ...)
            # cwd and env are the manager's, whatever is passed here; cleanup_kc=True: nbclient
            # shuts down a kernel it was given only when asked to
            with client.setup_kernel(stderr=subprocess.DEVNULL, cleanup_kc=True):
                ...  # run the cells; km.restart_kernel(now=True) restarts it isolated again
        finally:
            end_processes(km)  # every process the kernel started is gone, detached ones too
        ...  # read what the kernel wrote into the folder, before the with block removes it
    # isolation.sandbox: "bubblewrap", "unshare" or "none"; isolation.note: "" or why
    # file isolation was unavailable (show it in the report)

What a kernel gets:

- **A folder** (:func:`submission_folder`): a fresh temporary folder holding only the
  files given, removed afterwards. It is the kernel's working folder and ``HOME`` (IPython
  writes its ``.ipython`` profile there).
- **An environment** (:func:`scrubbed_env`): only the names in :data:`ENV_ALLOWLIST`, and
  ``PATH``/``HOME``/``PYTHONPATH`` set here, never the grader's values; nothing else of the
  instructor's (tokens, keys, cloud credentials) reaches the student's code. The kernel
  imports the same ``vitlab`` and ``vitlab_grader`` as the grader: ``PYTHONPATH`` names
  the folders holding them when the Python installation does not (a checkout on the
  grader's ``PYTHONPATH``, an editable install); installed into the environment, nothing.
- **A sandbox** where one can start (:func:`isolated_kernel_manager`), tried in this order:

  1. ``bubblewrap`` (``bwrap``, Debian/Ubuntu package ``bubblewrap``): a new mount
     namespace whose root is empty except for, read-only, the system libraries
     (``/usr`` and the ``/lib*``, ``/bin`` links), a few files of ``/etc`` (dynamic
     linker cache, time zone, fonts, users), the Python installation (``sys.prefix`` and
     ``sys.base_prefix``, so the virtual environment and its interpreter) and the
     directories of the ``vitlab`` and ``vitlab_grader`` packages the grader runs (with
     editable installs ``<checkout>/vitlab`` and ``<checkout>/grader/vitlab_grader``
     alone: the checkout's notebooks, tests and solutions stay invisible); read-write,
     the submission's folder; a private ``/tmp``, ``/proc`` of its own and a minimal
     ``/dev``. New user (uid 65534, every capability dropped), pid, network, IPC and UTS
     namespaces; ``--die-with-parent``, and ``--new-session`` so that the kernel's
     process group does not include ``bwrap`` itself.
  2. ``unshare`` (util-linux): the same layout, built by a shell script with ``mount`` and
     ``pivot_root`` in new user, mount, pid, network, IPC and UTS namespaces; the kernel
     is the namespace's first process, root of its user namespace (the grader's user
     outside) with every capability dropped (``setpriv``).
  3. none: the kernel runs as the grader's user with only the folder, environment and
     process isolation below, and :attr:`Isolation.note` says that file isolation was
     unavailable.

- **Processes**: the kernel starts in a session of its own (with the supervisor below,
  without a sandbox), not the grader's. In a sandbox it is in a new pid
  namespace: when the namespace's first process ends, the Linux kernel ends every other
  process in it, detached ones (``setsid``, double fork) included; :func:`end_processes`
  makes sure of it. Without a sandbox the kernel runs under a small supervisor that is a
  *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``): an orphaned descendant is
  re-parented to it rather than to ``init``, so the supervisor can find and kill every
  descendant when the kernel ends or is killed.
- **Transport**: the kernel talks to the grader over ZeroMQ's ``ipc`` transport: Unix
  sockets in a private runtime folder (mode 0700, bound into the sandbox at the same path,
  next to the connection file; removed by :func:`end_processes`). In a sandbox the kernel
  has no network at all (new network namespace); with or without one, no other user of
  the machine can reach its sockets, as they could TCP ports on 127.0.0.1.

- **Limits** (:class:`Limits`, :data:`DEFAULT_LIMITS`): the kernel starts under a small
  launcher that sets, inside the sandbox, ``RLIMIT_DATA`` (the memory it may allocate:
  heap and private mappings, 4 GiB by default), ``RLIMIT_NPROC`` (processes and threads of
  the sandbox's user: 256 by default, or 4 per CPU on larger machines; only in a
  sandbox, whose user namespace counts them apart from the grader's) and a lower CPU
  priority (``nice`` 10), then becomes the kernel. A kernel past its memory limit gets
  ``MemoryError`` or dies; either costs that submission only.
- **Messages**: the grader's end of the kernel's sockets refuses a message over
  :data:`MESSAGE_LIMIT` (ZeroMQ's ``MAXMSGSIZE``): one huge print cannot grow the grader.
  ZeroMQ drops that connection for good, so the kernel's later outputs are lost too; its
  answers files are not, and the notebook is still graded.
- **A CPU share** (:func:`cpu_cgroups`): where this process may make cgroups (root, or a
  delegated cgroup v2 subtree), each kernel starts in a cgroup of its own with the default
  CPU weight; everything it starts stays in it, so many busy processes share one kernel's
  part of the CPU. :attr:`Isolation.cpu_share` says which kind, or why there is none.

What it cannot do: limit CPU time (the grader's time limits do that), give a kernel a
CPU share where no cgroup can be made (a lower priority and a process limit instead; and
without a sandbox, a kernel running as root could leave its cgroup), or
hide what the Python installation itself contains (``vitlab``'s source included). Without
a sandbox the supervisor runs as the student's code does, so code that kills it first can
leave a detached process behind: only a sandbox's pid namespace cannot be left.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager

ENV_ALLOWLIST: tuple[str, ...] = (
    # Set here, never copied from the grader: HOME is the submission's folder, PATH the
    # virtual environment's bin folder then the system's, PYTHONPATH the folders of the
    # grader's vitlab and vitlab_grader outside the Python installation (if any).
    "HOME",
    "PATH",
    "PYTHONPATH",
    # Copied from the grader's environment when set there: locale and time zone (how text
    # and dates print), and the thread counts of the math libraries (so that several
    # kernels graded side by side do not oversubscribe the CPU).
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_NUMERIC",
    "TZ",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
)
"""The only names of the grader's environment a kernel sees (see :func:`scrubbed_env`)."""

_SET_HERE = ("HOME", "PATH", "PYTHONPATH")
_SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
_SANDBOX_UID = 65534  # "nobody": the kernel's user inside the sandbox
_ETC = (  # read-only in the sandbox: what Python, torch and matplotlib read; nothing secret
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/timezone",
    "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/hosts", "/etc/fonts", "/etc/alternatives",
    "/etc/mime.types", "/etc/matplotlibrc",
)  # fmt: skip
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")  # links into /usr on merged-/usr systems
_NAME = re.compile(r"^[^/\\\x00]+$")
_KILL_WAIT = 5.0  # seconds end_processes waits for the processes it killed to be gone
MESSAGE_LIMIT = 32 * 2**20  # bytes: the largest message the grader takes from a kernel


@dataclass(frozen=True)
class Limits:
    """What one kernel may use: memory (``RLIMIT_DATA``, bytes), processes and threads (``RLIMIT_NPROC``), nice.

    ``None`` (or 0 for ``nice``) leaves a limit unset. The process limit is set only in a
    sandbox: without one ``RLIMIT_NPROC`` would count every process of the grader's user.
    """

    memory: int | None = 4 * 2**30
    processes: int | None = max(256, 4 * (os.cpu_count() or 1))
    nice: int = 10


DEFAULT_LIMITS = Limits()
"""The defaults: 4 GiB, 256 processes and threads (4 per CPU on larger machines), nice 10; every chapter fits."""

# Sets the limits, then becomes the kernel (argv: memory, processes, nice, the kernel's command).
_LIMITER = r"""
import os, resource, sys
memory, processes, nice = (int(a) for a in sys.argv[1:4])
if memory > 0:
    resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))
if processes > 0:
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
if nice > 0:
    os.nice(nice)
os.execv(sys.argv[4], sys.argv[4:])
"""


# Joins a cgroup, then becomes the kernel's command (argv: the cgroup's cgroup.procs, the command).
_JOIN_CGROUP = r"""
import os, sys
with open(sys.argv[1], "w") as procs:
    procs.write(str(os.getpid()))
os.execvp(sys.argv[2], sys.argv[2:])
"""


def _own_cgroup(controller: str) -> str:
    """This process's cgroup in the hierarchy of ``controller`` (``""``: the v2 hierarchy), from /proc/self/cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return "/"


@functools.cache
def cpu_cgroups() -> tuple[Path | None, str]:
    """Where each kernel gets a cgroup of its own, and which kind: ``(folder, "cgroup v1")``,
    ``(folder, "cgroup v2")``, or ``(None, why not)``.

    A kernel's cgroup holds it and every process it starts (a process cannot leave it: the
    sandbox cannot write to the cgroup file system), and its CPU weight is the default, the
    same as every other kernel's: however many busy processes a submission starts, they
    share one kernel's part of the CPU. Making cgroups needs root (cgroup v1's ``cpu``
    hierarchy, or v2 where this process's cgroup has the ``cpu`` controller enabled for its
    children), or a v2 subtree delegated to the grader's user (``systemd-run --user --scope
    -p Delegate=yes``).
    """
    try:
        mounts = [line.split() for line in Path("/proc/self/mounts").read_text().splitlines()]
        v1 = next((Path(m[1]) for m in mounts if m[2] == "cgroup" and "cpu" in m[3].split(",")), None)
        v2 = next((Path(m[1]) for m in mounts if m[2] == "cgroup2"), None)
        if v1 is not None:
            folder, kind = v1 / _own_cgroup("cpu").lstrip("/"), "cgroup v1"
        elif v2 is not None:
            folder, kind = v2 / _own_cgroup("").lstrip("/"), "cgroup v2"
            control = folder / "cgroup.subtree_control"
            if "cpu" not in control.read_text().split():
                control.write_text("+cpu")  # allowed at the root and in a delegated subtree only
        else:
            return None, "no cgroup file system is mounted"
        probe = Path(tempfile.mkdtemp(prefix="vitlab-probe-", dir=folder))  # may this process make one here,
        try:  # and may a process join it?
            join = [sys.executable, "-I", "-S", "-c", _JOIN_CGROUP, str(probe / "cgroup.procs"), "true"]
            subprocess.run(join, check=True, capture_output=True, timeout=60)
        finally:
            os.rmdir(probe)
    except OSError as error:
        return None, f"no cgroup may be made ({error.strerror}: {error.filename}; it needs root or a delegated subtree)"
    except subprocess.SubprocessError:
        return None, f"a process may not join a cgroup made in {folder}"
    return folder, kind


def scrubbed_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a student's kernel: the allowlisted names, then ``extra``.

    From the grader's environment only the names of :data:`ENV_ALLOWLIST` that are set
    there are copied, except ``HOME`` (left out: :func:`isolated_kernel_manager` sets it
    to the submission's folder), ``PATH`` (set to the running interpreter's folder and
    the system's, whatever the grader's is) and ``PYTHONPATH`` (set to the folders holding
    the grader's ``vitlab`` and ``vitlab_grader`` when they are outside the Python
    installation, else left out). ``extra`` (such as
    ``{"VITLAB_CHECK_DATA": "1"}``) is added last and may name anything: it is the
    grader's explicit choice.
    """
    env = {name: os.environ[name] for name in ENV_ALLOWLIST if name not in _SET_HERE and name in os.environ}
    env["PATH"] = f"{Path(sys.executable).parent}:{_SYSTEM_PATH}"
    outside = [str(p.parent) for p in _package_dirs() if not _inside(str(p), _installation())]
    if outside:
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(outside))
    for name, value in (extra or {}).items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise TypeError(f"extra environment must map str to str, got {name!r}: {value!r}")
        env[name] = value
    return env


@dataclass(frozen=True)
class Isolation:
    """How a kernel was isolated: the sandbox that started, and why file isolation is missing."""

    sandbox: str  # "bubblewrap", "unshare" or "none"
    note: str = ""  # "" or why file isolation was unavailable (the grader's report shows it)
    cpu_share: str = ""  # "cgroup v1" or "cgroup v2" (cpu_cgroups), or "none: " and why not


@contextlib.contextmanager
def submission_folder(files: Mapping[str, bytes], parent: str | Path | None = None) -> Iterator[Path]:
    """A fresh temporary folder holding only ``files`` (relative path -> content); removed afterwards.

    A path is plain file names joined by ``/`` (``data/weights.pt``): not absolute, no
    ``.`` or ``..``, no backslash. ``parent``: where the folder is made (the grading run's
    own folder; default the system's temporary folder), always under a new, unique name.
    """
    for name, data in files.items():
        parts = name.split("/") if isinstance(name, str) else [""]
        if any(not _NAME.match(part) or part in (".", "..") for part in parts):
            raise ValueError(f"a submission file name must be plain file names joined by '/', got {name!r}")
        if not isinstance(data, bytes):
            raise TypeError(f"the content of {name!r} must be bytes, got {type(data).__name__}")
    folder = Path(tempfile.mkdtemp(prefix="vitlab-submission-", dir=parent))
    try:
        for name, data in files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(data)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --- the sandboxes ---------------------------------------------------------------------


def _package_dirs() -> list[Path]:
    """The folders of the ``vitlab`` and ``vitlab_grader`` packages that this grader runs.

    The kernel imports both: ``vitlab`` for the student's code and the checks' cases,
    ``vitlab_grader.harness`` for the grader's cells. They are the only parts of a
    checkout that a sandboxed kernel sees.
    """
    import importlib.util

    vitlab = importlib.util.find_spec("vitlab")  # found, not imported: the grader imports PyTorch late
    if vitlab is None or vitlab.origin is None:
        raise ModuleNotFoundError("the kernel needs vitlab, which is not installed")
    return [Path(vitlab.origin).resolve().parent, Path(__file__).resolve().parent]


def _installation() -> list[str]:
    """The Python installation: prefixes and the real interpreter's folder, outermost first."""
    paths = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
    paths |= {os.path.realpath(p) for p in list(paths)}
    paths.add(str(Path(os.path.realpath(sys.executable)).parent))
    return _outermost(p for p in paths if os.path.isdir(p))


def _inside(path: str, folders: Iterable[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def _python_paths() -> list[str]:
    """What a sandboxed kernel reads of Python: the installation and the grader's two packages, outermost first."""
    return _outermost([*_installation(), *(str(p) for p in _package_dirs())])


def _outermost(paths: Iterable[str]) -> list[str]:
    """``paths`` without those inside another one of them, sorted."""
    kept: list[str] = []
    for path in sorted(set(paths)):
        if not _inside(path, kept):
            kept.append(path)
    return kept


def _readonly_paths() -> tuple[list[tuple[str, str]], list[str]]:
    """``([(link, target)], [read-only directory or file])`` of the sandbox's root."""
    links, binds = [], ["/usr"]
    for path in _SYSTEM_LINKS:
        if os.path.islink(path):
            links.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            binds.append(path)
    binds += [p for p in _ETC if os.path.exists(p)]
    binds += [p for p in ("/sys/devices/system/cpu",) if os.path.isdir(p)]  # CPU counts for torch/OpenMP
    binds += [p for p in _python_paths() if not p.startswith("/usr/")]
    return links, _outermost(binds)


def _bwrap_argv(folder: Path, runtime: Path) -> list[str]:
    links, binds = _readonly_paths()
    argv = [
        "bwrap", "--unshare-all", "--unshare-user", "--uid", str(_SANDBOX_UID), "--gid", str(_SANDBOX_UID),
        "--cap-drop", "ALL", "--die-with-parent", "--new-session",
        "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
    ]  # fmt: skip
    for link, target in links:
        argv += ["--symlink", target, link]
    for path in binds:
        argv += ["--ro-bind", path, path]
    argv += ["--bind", str(runtime), str(runtime), "--bind", str(folder), str(folder), "--chdir", str(folder)]
    return argv


# The unshare sandbox: this script runs as root of a new user namespace, builds the root
# in a tmpfs, pivots into it, and becomes the kernel (the pid namespace's first process)
# with no capability. The path lists are one path a line (paths may hold spaces).
_UNSHARE_SCRIPT = r"""
set -euf
IFS='
'
had_path="${PATH+1}"; kernel_path="${PATH-}"; PATH=/usr/sbin:/usr/bin:/sbin:/bin
root="$VITLAB_RUNTIME/root"  # a mount point in the private runtime folder (removed afterwards)
mkdir -p "$root"
mount -t tmpfs -o mode=0755 none "$root"
ro() { [ -e "$1" ] || return 0
       if [ -d "$1" ]; then mkdir -p "$root$1"; else mkdir -p "$root$(dirname "$1")"; : > "$root$1"; fi
       mount --rbind "$1" "$root$1"; mount -o remount,bind,ro "$root$1"; }
rw() { mkdir -p "$root$1"; mount --bind "$1" "$root$1"; }
mkdir -p "$root/tmp" "$root/proc" "$root/dev" "$root/old"
mount -t tmpfs -o mode=1777 none "$root/tmp"  # first: a Python installed under /tmp is bound over it
for p in $VITLAB_RO; do ro "$p"; done
for l in $VITLAB_LINKS; do ln -s "${l#*=}" "$root${l%%=*}"; done
mount -t proc proc "$root/proc"
for d in null zero full random urandom tty; do : > "$root/dev/$d"; mount --bind "/dev/$d" "$root/dev/$d"; done
ln -s /proc/self/fd "$root/dev/fd"
rw "$VITLAB_RUNTIME"; rw "$VITLAB_FOLDER"
cd "$root"; pivot_root . old; umount -l /old; rmdir /old
cd "$VITLAB_FOLDER"
setpriv="$VITLAB_SETPRIV"
unset OLDPWD PWD VITLAB_RO VITLAB_LINKS VITLAB_RUNTIME VITLAB_FOLDER VITLAB_SETPRIV
if [ -n "$had_path" ]; then PATH="$kernel_path"; export PATH; else unset PATH; fi
exec "$setpriv" --inh-caps=-all --bounding-set=-all --no-new-privs -- "$@"
"""


def _unshare_argv(folder: Path, runtime: Path) -> tuple[list[str], dict[str, str]]:
    """The ``unshare`` command and the variables its script reads (removed before the kernel starts)."""
    links, binds = _readonly_paths()
    argv = [
        "unshare", "--user", "--map-root-user", "--mount", "--pid", "--fork", "--kill-child", "--net", "--ipc",
        "--uts", "--", "/bin/sh", "-c", _UNSHARE_SCRIPT, "vitlab-sandbox",
    ]  # fmt: skip
    env = {
        "VITLAB_RO": "\n".join(binds),
        "VITLAB_LINKS": "\n".join(f"{link}={target}" for link, target in links),
        "VITLAB_RUNTIME": str(runtime),
        "VITLAB_FOLDER": str(folder),
        "VITLAB_SETPRIV": shutil.which("setpriv") or "setpriv",
    }
    return argv, env


@functools.cache
def _available(sandbox: str) -> str:
    """Why ``sandbox`` cannot start a Python process on this machine; ``""`` when it can."""
    folder = Path(tempfile.mkdtemp(prefix="vitlab-probe-"))
    try:
        if sandbox == "bubblewrap":
            if shutil.which("bwrap") is None:
                return "bubblewrap is not installed (apt-get install bubblewrap)"
            argv, env = _bwrap_argv(folder, folder), {}
        else:
            if shutil.which("unshare") is None or shutil.which("setpriv") is None:
                return "unshare or setpriv (util-linux) is not installed"
            argv, env = _unshare_argv(folder, folder)
        probe = [*argv, sys.executable, "-I", "-S", "-c", "import os; open('ok', 'w').close()"]
        try:
            done = subprocess.run(probe, env=env, capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{sandbox} could not start: {exc}"
        if done.returncode != 0 or not (folder / "ok").exists():
            why = done.stderr.decode(errors="replace").strip().splitlines()
            return f"{sandbox} could not start: {why[-1] if why else f'exit status {done.returncode}'}"
        return ""
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# Without a sandbox the kernel runs under this supervisor, a child subreaper: orphaned
# descendants (double fork, setsid) are re-parented to it, so it can kill them all when
# the kernel ends or when it is told to (SIGTERM, or the grader dying).
_SUPERVISOR = r"""
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG: the grader died
signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupts are the kernel's, in the same process group
class Stop(Exception):
    pass
def stop(*_):
    raise Stop
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGHUP, stop)
kernel = os.fork()
if kernel == 0:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    os.execv(sys.argv[1], sys.argv[1:])
def descendants():
    children = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child); todo.append(child)
    return found
code = 1
try:
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == kernel:
            code = os.waitstatus_to_exitcode(status)
            break
except (Stop, ChildProcessError):
    pass
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
while True:
    found = descendants()
    if not found:
        break
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
sys.exit(code if code >= 0 else 128 - code)
"""


class BoundedKernelClient(AsyncKernelClient):
    """A kernel client whose sockets refuse a message over :data:`MESSAGE_LIMIT` (ZeroMQ drops the connection)."""

    def _create_connected_socket(self, channel: str, identity: bytes | None = None) -> Any:
        import zmq
        from jupyter_client.connect import channel_socket_types

        sock = self.context.socket(channel_socket_types[channel])
        sock.linger = 1000
        sock.setsockopt(zmq.MAXMSGSIZE, MESSAGE_LIMIT)  # before connect: it applies to new connections
        if identity:
            sock.identity = identity
        if getattr(self, "curve_publickey", None) is not None:  # as jupyter_client does, where it has keys
            sock.curve_secretkey = self.curve_secretkey  # type: ignore[attr-defined]
            sock.curve_publickey = self.curve_publickey  # type: ignore[attr-defined]
            sock.curve_serverkey = self.curve_publickey  # type: ignore[attr-defined]
        sock.connect(self._make_url(channel))
        return sock


class IsolatedKernelManager(AsyncKernelManager):
    """An :class:`AsyncKernelManager` whose kernel always starts in one folder, with one environment, isolated.

    Made by :func:`isolated_kernel_manager`; the ``cwd`` and ``env`` that a caller (nbclient)
    passes to :meth:`start_kernel` are replaced by the manager's own, also on restarts.
    """

    _folder: Path
    _kernel_env: dict[str, str]
    _isolation: Isolation
    _runtime: Path
    _supervisors: set[int]
    _limits: Limits
    _cgroup: Path | None = None  # the kernel's own cgroup (cpu_cgroups), made by isolated_kernel_manager
    _startup: tuple[str, ...] = ()  # IPython options that run lines at start-up (isolated_kernel_manager)

    def _setup(self, folder: Path, env: dict[str, str], isolation: Isolation, runtime: Path, limits: Limits) -> None:
        self._folder, self._kernel_env, self._isolation, self._runtime = folder, env, isolation, runtime
        self._supervisors, self._limits = set(), limits
        self.client_factory = BoundedKernelClient
        # Unix sockets in the private runtime folder: a sandbox has no network, and no other
        # user of the machine can reach them (TCP ports on 127.0.0.1 are open to everyone).
        self.transport, self.ip = "ipc", str(runtime / "kernel")
        self.connection_file = str(runtime / "kernel.json")
        # Interrupts by message: a signal to the process group would reach bwrap/unshare,
        # not only the kernel (which is in a session of its own in the sandbox).
        mode = "signal" if isolation.sandbox == "none" else "message"
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        self._kernel_spec = KernelSpec(argv=argv, display_name="Python 3", language="python", interrupt_mode=mode)

    @property
    def isolation(self) -> Isolation:
        return self._isolation

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        # parent_handle=1: do not watch the parent process (invisible from a pid namespace)
        kernel = [sys.executable, "-m", "ipykernel_launcher", "-f", self.connection_file,
                  "--IPKernelApp.parent_handle=1", *self._startup, *(extra_arguments or [])]  # fmt: skip
        limits = self._limits
        processes = limits.processes if self._isolation.sandbox != "none" else None
        numbers = [limits.memory or 0, processes or 0, limits.nice]
        kernel = [sys.executable, "-I", "-S", "-c", _LIMITER, *map(str, numbers), *kernel]
        if self._isolation.sandbox == "bubblewrap":
            command = [*_bwrap_argv(self._folder, self._runtime), *kernel]
        elif self._isolation.sandbox == "unshare":
            command = [*_unshare_argv(self._folder, self._runtime)[0], *kernel]
        else:
            command = [sys.executable, "-I", "-S", "-c", _SUPERVISOR, *kernel]
        if self._cgroup is not None:  # joined before the sandbox starts: all it runs is inside
            command = [sys.executable, "-I", "-S", "-c", _JOIN_CGROUP, str(self._cgroup / "cgroup.procs"), *command]
        return command

    async def _async_pre_start_kernel(self, **kw: Any) -> tuple[list[str], dict[str, Any]]:
        kw["cwd"] = str(self._folder)
        env = dict(self._kernel_env)
        if self._isolation.sandbox == "unshare":
            env |= _unshare_argv(self._folder, self._runtime)[1]  # read by the script, unset before the kernel
        kw["env"] = env
        kw["independent"] = True  # no JPY_PARENT_PID: the kernel cannot see the grader's pid in its namespace
        return await super()._async_pre_start_kernel(**kw)

    async def _async_post_start_kernel(self, **kw: Any) -> None:
        await super()._async_post_start_kernel(**kw)
        pid = getattr(self.provisioner, "pid", None)
        if pid is not None and self._isolation.sandbox == "none":
            self._supervisors.add(pid)

    async def _async_kill_kernel(self, restart: bool = False) -> None:
        pid = getattr(self.provisioner, "pid", None)
        if self._isolation.sandbox == "none" and pid is not None and self.has_kernel:
            # The supervisor kills the kernel and every descendant, then exits; SIGKILL to the
            # process group (below) would kill the supervisor before it could.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            await _wait_gone([pid], _KILL_WAIT)
        await super()._async_kill_kernel(restart=restart)


async def _wait_gone(pids: list[int], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def isolated_kernel_manager(
    folder: Path,
    env: Mapping[str, str],
    *,
    sandbox: bool = True,
    limits: Limits = DEFAULT_LIMITS,
    parent: str | Path | None = None,
    startup: Sequence[str] = (),
) -> tuple[AsyncKernelManager, Isolation]:
    """A kernel manager for one submission, and how its kernel will be isolated.

    The kernel (``python -m ipykernel_launcher -f <connection file>``) starts with working
    folder ``folder``, environment exactly ``env`` (plus ``HOME=folder`` when ``env`` has
    no ``HOME``), in its own session, and, with ``sandbox=True``, in the first sandbox
    that starts on this machine (bubblewrap, then unshare; the module's docstring says
    what it sees), under ``limits``. Its private runtime folder is made in ``parent``
    (default: the system's temporary folder) under a new, unique name. Use it as
    ``nbclient.NotebookClient(nb, km=km)``; after the kernel's shutdown call
    :func:`end_processes`. ``startup``: lines of Python the kernel runs before any cell (IPython's
    ``exec_lines``; the grader arms its tripwires so, :func:`vitlab_grader.anomalies.arm`), also after a restart.
    """
    folder = Path(folder)
    if not folder.is_absolute() or not folder.is_dir():
        raise ValueError(f"folder must be an existing absolute folder, got {str(folder)!r}")
    kernel_env = {str(k): str(v) for k, v in env.items()}
    kernel_env.setdefault("HOME", str(folder))
    notes = []
    chosen = "none"
    if sandbox:
        for name in ("bubblewrap", "unshare"):
            why = _available(name)
            if not why:
                chosen = name
                break
            notes.append(why)
    if chosen == "none":
        notes = notes or ["the sandbox was turned off"]
        note = "file isolation unavailable: " + "; ".join(notes)
    else:
        note = ""
    cgroups, kind = cpu_cgroups()
    cgroup = None
    if cgroups is not None:
        try:
            cgroup = Path(tempfile.mkdtemp(prefix="vitlab-kernel-", dir=cgroups))
        except OSError as error:
            kind = f"no cgroup could be made ({error.strerror}: {error.filename})"
    isolation = Isolation(chosen, note, kind if cgroup is not None else f"none: {kind}")
    runtime = Path(tempfile.mkdtemp(prefix="vitlab-kernel-", dir=parent))
    km = IsolatedKernelManager(kernel_name="python3")
    km._setup(folder, kernel_env, isolation, runtime, limits)
    km._cgroup = cgroup
    km._startup = tuple(f"--IPKernelApp.exec_lines={line}" for line in startup)
    return km, isolation


# --- ending every process ------------------------------------------------------------------


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _processes() -> dict[int, tuple[int, int, int]]:
    """Every process: ``pid -> (parent pid, process group, session)``."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            found[int(entry)] = (int(fields[1]), int(fields[2]), int(fields[3]))
    return found


def _descendants(pid: int, processes: dict[int, tuple[int, int, int]] | None = None) -> list[int]:
    children: dict[int, list[int]] = {}
    for child, (parent, _, _) in (_processes() if processes is None else processes).items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _pid_namespace(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _reap(pids: list[int]) -> None:
    """Collect the exit status of those of ``pids`` that are this process's children."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def end_processes(km: AsyncKernelManager) -> None:
    """After the kernel's shutdown: kill every process it started, detached ones included.

    In a sandbox: every process of the sandbox's pid namespace (and ``bwrap``/``unshare``
    themselves). Without one: the supervisor (which kills every descendant) and anything
    left in the kernel's session or process group. Then the kernel's private runtime
    folder is removed. Waits until the processes are gone (a few seconds at most);
    calling it again does nothing.
    """
    if not isinstance(km, IsolatedKernelManager):
        raise TypeError(f"end_processes takes a manager from isolated_kernel_manager, got {type(km).__name__}")
    provisioner = km.provisioner
    pid = getattr(provisioner, "pid", None)
    groups = {pid} if pid is not None else set()
    if km._isolation.sandbox == "none":
        supervisors = sorted(p for p in km._supervisors | groups if _alive(p))
        for supervisor in supervisors:
            with contextlib.suppress(ProcessLookupError):
                os.kill(supervisor, signal.SIGTERM)  # it kills its descendants, then itself
        _wait(supervisors, _KILL_WAIT)
        groups |= km._supervisors
    deadline = time.monotonic() + _KILL_WAIT
    own = _pid_namespace(os.getpid())
    while True:
        processes = _processes()
        process = getattr(provisioner, "process", None)
        unreaped = pid is not None and process is not None and process.poll() is None  # else pid may be reused
        mine = set(_descendants(pid, processes)) if unreaped and pid is not None else set()
        # The sandbox's pid namespace, read from its live processes each time: a namespace's
        # number is reused as soon as it is gone, maybe by a classmate's sandbox.
        namespaces = {ns for p in mine if (ns := _pid_namespace(p)) and ns != own}
        inside = _cgroup_processes(km._cgroup)
        left = [
            p
            for p, (_, group, session) in processes.items()
            if p != os.getpid()
            and (
                p in mine
                or p in inside
                or group in groups
                or session in groups
                or (namespaces and _pid_namespace(p) in namespaces)
            )
        ]
        if not left or time.monotonic() > deadline:
            break
        _kill(left)
        _reap(left)
        time.sleep(0.02)
    if provisioner is not None and getattr(provisioner, "process", None) is not None:
        with contextlib.suppress(Exception):
            provisioner.process.wait(timeout=_KILL_WAIT)  # type: ignore[union-attr]
    shutil.rmtree(km._runtime, ignore_errors=True)
    if km._cgroup is not None:
        _remove_cgroup(km._cgroup, time.monotonic() + _KILL_WAIT)


def _remove_cgroup(cgroup: Path, deadline: float) -> None:
    """Remove a kernel's cgroup once the processes killed in it have left it (they leave as they
    are reaped, a moment after the kill); what is still inside then is killed again."""
    while True:
        try:
            os.rmdir(cgroup)
            return
        except FileNotFoundError:
            return
        except OSError:  # busy: not yet empty
            if time.monotonic() > deadline:
                return
            left = sorted(_cgroup_processes(cgroup))
            _kill(left)
            _reap(left)
            time.sleep(0.02)


def _cgroup_processes(cgroup: Path | None) -> set[int]:
    """The processes in a kernel's cgroup (none where it has none, or it is gone)."""
    try:
        return {int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()} if cgroup else set()
    except OSError:
        return set()


def _wait(pids: list[int], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        _reap(pids)
        time.sleep(0.02)


__all__ = [
    "DEFAULT_LIMITS",
    "ENV_ALLOWLIST",
    "MESSAGE_LIMIT",
    "BoundedKernelClient",
    "Isolation",
    "Limits",
    "IsolatedKernelManager",
    "end_processes",
    "isolated_kernel_manager",
    "scrubbed_env",
    "submission_folder",
]
