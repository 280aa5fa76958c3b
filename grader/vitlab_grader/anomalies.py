"""Anomalies: what a submission's own code does that no honest answer needs, for the instructor.

An anomaly never changes a score. It is judged on **what the code does**, never on a word:

- read with Python's :mod:`ast` (the code never runs here), every name is resolved through
  the imports and assignments of the notebook (``import inspect as i``, ``from sys import
  _getframe as g``, ``m = importlib.import_module("vitlab.mod" + "els.pit")``,
  ``getattr(vitlab, "checks")``, ``__import__(...)``, ``sys.modules[...]``, strings joined
  from constants); ``torch.stack`` is not ``inspect.stack``, ``Path.home()`` read is not a
  write, ``!pip install`` is not a shell command worth a note;
- only **the cells the student wrote** are judged (:func:`student_cells`): a cell that is
  one of the release's own, unchanged (the Colab setup cell imports ``subprocess`` and
  reads ``sys.modules``), is left out; a release cell the student edited is judged on what
  the edit added. The release's cells still bind names (``import sys`` in the setup cell).
- **in the kernel**, every function of ``vitlab.checks`` except the machinery the grader's
  cell uses (``vitlab.checks._core``) is a *tripwire* while a submission is graded
  (:func:`arm`): its code object is replaced, so however the function is reached (an alias,
  a computed module name, ``gc``) a call records its name and raises. The check's private
  reference computes nothing for the student's code, and the grader reports the call
  (:func:`read_tripped`).

A copied vitlab object (:func:`copied`) is one the exercise's check is built from or that
answers it (:data:`ANSWERED_BY`), used by the student's answer: the function the check
is given, or a name it uses that the student's cells define, followed to the end. The
same objects are flagged again when the answer *ran* one (:func:`ran`), however it was
reached: the grader's harness records, in the kernel, the vitlab functions an answer runs
(:mod:`vitlab_grader.harness`), and an answer that turns that record off is an anomaly.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import os
import posixpath
import re
import sys
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from vitlab_grader.exercises import parse, source

# ---------------------------------------------------------------- which cells the student wrote


def student_cells(cells: list[dict[str, Any]], release_cells: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(code, release code)`` of each code cell the student wrote or changed.

    A cell whose source is one of the release's code cells (by content, wherever it is) is
    the release's and left out. A changed cell that keeps a release cell's id comes with
    that cell's code, whose findings are not the student's; a new cell with an empty string.
    """
    release = [c for c in release_cells if c.get("cell_type") == "code"]
    texts = {source(c).strip() for c in release}
    by_id = {c.get("id"): source(c) for c in release if c.get("id")}
    found = []
    for cell in cells:
        if cell.get("cell_type") != "code" or source(cell).strip() in texts:
            continue
        found.append((source(cell), by_id.get(cell.get("id"), "")))
    return found


# ---------------------------------------------------------------- what a name stands for


def _string(node: ast.AST, strings: dict[str, str]) -> str | None:
    """The string an expression is, where it is built from constants only (``"vitlab.mod" + "els"``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return strings.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _string(node.left, strings), _string(node.right, strings)
        return left + right if left is not None and right is not None else None
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            part = _string(value.value if isinstance(value, ast.FormattedValue) else value, strings)
            if part is None:
                return None
            parts.append(part)
        return "".join(parts)
    if (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"
        and len(node.args) == 1 and isinstance(node.args[0], (ast.List, ast.Tuple))
    ):  # fmt: skip
        sep = _string(node.func.value, strings)
        parts = [_string(e, strings) for e in node.args[0].elts]
        if sep is not None and all(p is not None for p in parts):
            return sep.join(p for p in parts if p is not None)
    return None


@dataclass
class Names:
    """The notebook's bindings: ``{local name: dotted name}`` of modules and their objects, and strings."""

    dotted: dict[str, str] = field(default_factory=dict)
    strings: dict[str, str] = field(default_factory=dict)

    def learn(self, tree: ast.AST) -> None:
        """Add the imports and simple assignments of ``tree`` (in order, as the notebook runs them)."""
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.dotted[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        self.dotted[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if alias.name != "*":
                        self.dotted[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        text = _string(node.value, self.strings)
                        if text is not None:
                            self.strings[target.id] = text
                        name = self.resolve(node.value)
                        if name is not None:
                            self.dotted[target.id] = name

    def builtin(self, node: ast.AST, name: str) -> bool:
        """Whether ``node`` is the builtin ``name`` (``getattr``, ``open``...): not rebound by the notebook."""
        if isinstance(node, ast.Name) and node.id == name and node.id not in self.dotted:
            return True
        return self.resolve(node) == f"builtins.{name}"

    def resolve(self, node: ast.AST) -> str | None:
        """The dotted name an expression stands for (``"inspect.stack"``), or ``None`` if unknown."""
        if isinstance(node, ast.Name):
            return self.dotted.get(node.id)
        if isinstance(node, ast.Attribute):
            if node.attr == "__dict__":
                return self.resolve(node.value)
            base = self.resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Subscript):  # sys.modules["x"], vars(m)["f"], m.__dict__["f"]
            key = _string(node.slice, self.strings)
            base = self.resolve(node.value)
            if key is not None and base == "sys.modules":
                return key
            if key is not None and base is not None and isinstance(node.value, (ast.Attribute, ast.Call)):
                dictish = (isinstance(node.value, ast.Attribute) and node.value.attr == "__dict__") or (
                    isinstance(node.value, ast.Call)
                )
                return f"{base}.{key}" if dictish else None
            return None
        if isinstance(node, ast.Call):
            return self._resolve_call(node)
        return None

    def _resolve_call(self, node: ast.Call) -> str | None:
        func, args = node.func, node.args
        first = _string(args[0], self.strings) if args else None
        if self.resolve(func) == "importlib.import_module" and first is not None:
            return first
        if self.builtin(func, "__import__") and first is not None:
            fromlist = args[3] if len(args) > 3 else next((k.value for k in node.keywords if k.arg == "fromlist"), None)
            empty = fromlist is None or (isinstance(fromlist, (ast.List, ast.Tuple)) and not fromlist.elts)
            return first.split(".")[0] if empty else first
        if self.builtin(func, "getattr") and len(args) >= 2:
            base, attr = self.resolve(args[0]), _string(args[1], self.strings)
            return f"{base}.{attr}" if base and attr is not None else None
        if self.builtin(func, "vars") and len(args) == 1:
            return self.resolve(args[0])
        if self.resolve(func) in ("sys.modules.get", "sys.modules.__getitem__") and first is not None:
            return first
        return None


def names_of(code: Iterable[str]) -> Names:
    """The bindings of every cell of ``code`` that parses, in order."""
    names = Names()
    for text in code:
        try:
            names.learn(parse(text))
        except SyntaxError:
            continue
    return names


def _uses(tree: ast.AST, names: Names) -> Iterable[tuple[ast.AST, str]]:
    """``(node, dotted name)`` of every name, attribute, lookup or dynamic import the code resolves."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
            name = names.resolve(node)
            if name is not None:
                yield node, name
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                yield node, f"{node.module}.{alias.name}" if alias.name != "*" else node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name


# ---------------------------------------------------------------- what the code does

FRAME_CALLS = {
    "sys._getframe", "sys._current_frames", "inspect.currentframe", "inspect.stack", "inspect.trace",
    "inspect.getouterframes", "inspect.getinnerframes", "traceback.walk_stack", "traceback.walk_tb",
}  # fmt: skip
FRAME_ATTRIBUTES = {"f_back", "f_locals", "f_globals", "f_builtins", "gi_frame", "cr_frame", "ag_frame", "tb_frame"}
PROCESS_MODULES = ("subprocess", "multiprocessing", "pty", "pexpect")
OS_PROCESSES = {
    "system", "popen", "fork", "forkpty", "setsid", "execv", "execve", "execvp", "execvpe", "execl", "execle",
    "execlp", "posix_spawn", "posix_spawnp", "spawnv", "spawnve", "spawnl",
}  # fmt: skip
ENVIRONMENT = {"os.environ", "os.environb", "os.getenv", "os.putenv", "os.unsetenv"}
INTROSPECTION = {
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.setprofile", "sys.settrace",
    "threading.setprofile", "threading.settrace", "ctypes",
}  # fmt: skip
EVENTS = ("post_run_cell", "pre_run_cell", "post_execute", "pre_execute")
# Shell commands an honest Colab notebook runs (installing packages, looking at the machine, fetching
# data into its folder); any other is noted.
HONEST_SHELL = re.compile(
    r"^(\{[^}]*\}|python3?|\S*/python3?)\s+-m\s+pip\b"
    r"|^(pip3?|uv\s+pip|conda|mamba|apt(-get)?|nvidia-smi|ls|pwd|nproc|free|df|wget|unzip|gdown)(\s|$)"
)
_CHECK_LINE = re.compile(r"\b(PASS|FAIL|TODO) [A-Za-z_]\w*[ :\[]")
_SHELL_LINE = re.compile(r"^\s*!+(.*)$", re.MULTILINE)
_SHELL_CELL = re.compile(r"^\s*%%(bash|sh|script\b[^\n]*|system)\s*\n(.*)", re.DOTALL)
_SHELL_MAGIC = re.compile(r"^\s*%(system|sx)\b(.*)$", re.MULTILINE)
WORK = ".vitlab-grader"  # the grader's work folder in the submission's: cases, answers, the tripwires' record
COLAB_FOLDER = "/content"  # Colab's working folder (and Google Drive under it): the student's own there


def _shell(text: str) -> set[str]:
    commands = [m.group(1) for m in _SHELL_LINE.finditer(text)] + [m.group(2) for m in _SHELL_MAGIC.finditer(text)]
    cell = _SHELL_CELL.match(text)
    if cell is not None:
        commands += cell.group(2).splitlines()
    found = set()
    for command in commands:
        command = command.strip()
        if command and not command.startswith("#") and not HONEST_SHELL.match(command):
            found.add(f"runs a shell command ({command.split()[0][:40]})")
    return found


# Calls that write (or remove) files, and which of their arguments are the paths written.
_WRITES = {
    **{f"os.{f}": (0,) for f in ("remove", "unlink", "rmdir", "removedirs", "mkdir", "makedirs", "chmod", "chown",
                                 "truncate", "utime", "mkfifo", "lchown")},
    **{f"os.{f}": (0, 1) for f in ("rename", "renames", "replace", "symlink", "link")},
    **{f"shutil.{f}": (1,) for f in ("copy", "copy2", "copyfile", "copytree", "move", "copymode", "copystat")},
    "shutil.rmtree": (0,), "torch.save": (1,), "numpy.save": (0,), "numpy.savez": (0,), "numpy.savetxt": (0,),
    "numpy.savez_compressed": (0,), "torch.jit.save": (1,), "torch.onnx.export": (2,),
}  # fmt: skip
_PATH_WRITES = {"write_text", "write_bytes", "touch", "mkdir", "unlink", "rmdir", "chmod", "symlink_to",
                "hardlink_to", "rename", "replace"}  # fmt: skip
_PATHS = {"pathlib.Path", "pathlib.PosixPath", "pathlib.PurePath", "pathlib.PurePosixPath", "os.fspath"}


@dataclass
class _Scan:
    names: Names
    paths: dict[str, str] = field(default_factory=dict)  # local name -> the path it holds
    path_objects: set[str] = field(default_factory=set)  # local names that hold a pathlib path
    found: set[str] = field(default_factory=set)

    def is_path_object(self, node: ast.AST) -> bool:
        """Whether an expression is a pathlib path (a string's ``replace`` is no file's)."""
        if isinstance(node, ast.Name):
            return node.id in self.path_objects
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            return self.is_path_object(node.left)
        if isinstance(node, ast.Call):
            if self.names.resolve(node.func) in _PATHS - {"os.fspath"}:
                return True
            func = node.func
            return isinstance(func, ast.Attribute) and (
                (func.attr in ("home", "cwd") and self.names.resolve(func.value) in _PATHS)
                or (func.attr in ("expanduser", "resolve", "absolute", "joinpath") and self.is_path_object(func.value))
            )
        return False

    def path(self, node: ast.AST) -> str | None:
        """The path an expression is, where the code makes it from constants (``Path.home() / "x"``)."""
        text = _string(node, self.names.strings)
        if text is not None:
            return text
        if isinstance(node, ast.Name):
            return self.paths.get(node.id)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            left, right = self.path(node.left), self.path(node.right)
            return posixpath.join(left, right) if left is not None and right is not None else None
        if isinstance(node, ast.Call):
            func, args = node.func, node.args
            called = self.names.resolve(func)
            parts: list[str | None] = []
            if called == "pathlib.Path.home":
                return "~"
            if called in ("pathlib.Path.cwd", "os.getcwd"):
                return "."
            if called == "os.path.expanduser" and args:
                return self.path(args[0])
            if isinstance(func, ast.Attribute) and func.attr in ("expanduser", "resolve", "absolute") and not args:
                return self.path(func.value)
            if isinstance(func, ast.Attribute) and func.attr == "joinpath":
                parts = [self.path(func.value), *map(self.path, args)]
            elif called in _PATHS or called == "os.path.join":
                parts = [self.path(a) for a in args]
            if parts and all(p is not None for p in parts):
                return posixpath.join(*(p for p in parts if p is not None))
        return None

    def write(self, node: ast.AST | None) -> None:
        target = self.path(node) if node is not None else None
        if target is not None and outside(target):
            self.found.add(f"writes outside its folder ({target[:120]!r})")
        elif target is not None and posixpath.normpath(target).split("/")[0] == WORK:
            self.found.add(f"writes into the grader's work folder ({target[:120]!r})")

    def call(self, node: ast.Call) -> None:
        called = self.names.resolve(node.func)
        arg = node.args
        mode_node = arg[1] if len(arg) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
        mode = _string(mode_node, self.names.strings) if mode_node is not None else "r"
        if (called in ("builtins.open", "io.open", "codecs.open") or self.names.builtin(node.func, "open")) and arg:
            if mode is not None and set(mode) & set("wax+"):
                self.write(arg[0])
        elif called == "os.open" and arg:
            flags = ast.unparse(arg[1]) if len(arg) > 1 else ""
            if any(flag in flags for flag in ("O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC")):
                self.write(arg[0])
        elif called in _WRITES:
            for index in _WRITES[called]:
                keyword = next((k.value for k in node.keywords if k.arg in ("dst", "f", "file", "path")), None)
                self.write(arg[index] if index < len(arg) else keyword)
        elif (
            isinstance(node.func, ast.Attribute) and node.func.attr in _PATH_WRITES | {"open"}
            and self.is_path_object(node.func.value)
        ):  # fmt: skip
            if node.func.attr == "open":
                mode_node = arg[0] if arg else next((k.value for k in node.keywords if k.arg == "mode"), None)
                mode = _string(mode_node, self.names.strings) if mode_node is not None else "r"
                if mode is not None and not set(mode) & set("wax+"):
                    return
            self.write(node.func.value)
            if node.func.attr in ("rename", "replace", "symlink_to", "hardlink_to") and arg:
                self.write(arg[0])
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("system", "getoutput") and arg:
            owner = node.func.value  # get_ipython().system("...")
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "get_ipython":
                command = _string(arg[0], self.names.strings)
                self.found |= _shell("!" + command) if command is not None else {"runs a shell command (computed)"}


def outside(path: str) -> bool:
    """Whether a path leaves the folder a notebook runs in: absolute (Colab's ``/content`` excepted),
    in the home folder (``~``), or climbing out with ``..``."""
    if path.startswith("~"):
        return True
    normal = posixpath.normpath(path)
    if normal.startswith("/"):
        return not (normal == COLAB_FOLDER or normal.startswith(COLAB_FOLDER + "/"))
    return normal == ".." or normal.startswith("../")


def _is_module_test(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """``"google.colab" in sys.modules``: a membership test, which reads nothing from the modules."""
    parent = parents.get(node)
    return (
        isinstance(parent, ast.Compare)
        and node in parent.comparators
        and all(isinstance(op, (ast.In, ast.NotIn)) for op in parent.ops)
    )


def findings(text: str, names: Names) -> set[str]:
    """What one code cell does that a grader should know of (see :func:`suspicious`)."""
    found = _shell(text)
    try:
        tree = parse(text)
    except SyntaxError:
        return found
    scan = _Scan(names)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target = scan.path(node.value)
            if target is not None:
                scan.paths[node.targets[0].id] = target
            if scan.is_path_object(node.value):
                scan.path_objects.add(node.targets[0].id)
    for node, name in _uses(tree, names):
        parent = parents.get(node)
        if isinstance(parent, ast.Attribute) and parent.value is node and names.resolve(parent):
            continue  # the longest name only: sys._getframe, not sys
        store = isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del))
        if name in FRAME_CALLS:
            found.add(f"walks the call stack ({name})")
        elif name == "sys.modules" or name.startswith("sys.modules."):
            if store or not _is_module_test(node, parents):
                found.add("reads or changes sys.modules")
        elif name in ENVIRONMENT or name.startswith("os.environ."):
            found.add(f"reads or sets the environment ({name})")
        elif (
            name.split(".")[0] in PROCESS_MODULES
            and "." in name
            or (name.startswith("os.") and name.split(".")[1] in OS_PROCESSES)
        ):
            found.add(f"starts processes ({name})")
        elif name in INTROSPECTION or name.split(".")[0] == "ctypes":
            found.add(f"searches or traces the interpreter ({name})")
        elif name.split(".")[0] == "vitlab_grader":
            found.add(f"uses the grader's own code ({name})")
        elif name == "importlib.reload" and isinstance(parent, ast.Call):
            found.add("reloads a module (importlib.reload)")
        if store and name.split(".")[0] in ("vitlab", "vitlab_grader") and "." in name:
            found.add(f"replaces {name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in FRAME_ATTRIBUTES:
            found.add(f"walks the call stack (.{node.attr})")
        elif isinstance(node, ast.Attribute) and node.attr == "__code__" and isinstance(node.ctx, ast.Store):
            found.add("replaces a function's code (.__code__)")
        elif isinstance(node, ast.Call):
            scan.call(node)
            if scan.names.builtin(node.func, "setattr") and len(node.args) >= 2:
                owner, attr = names.resolve(node.args[0]), _string(node.args[1], names.strings)
                if owner and owner.split(".")[0] in ("vitlab", "vitlab_grader"):
                    found.add(f"replaces {owner}.{attr if attr is not None else '...'}")
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "register":
                if isinstance(func.value, ast.Attribute) and func.value.attr == "events":
                    found.add("registers an IPython event hook")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            line = _CHECK_LINE.search(node.value)
            if line is not None:
                found.add(f"writes a check's result line ({line.group(0).strip(' :[')} ...)")
            if "vnd.vitlab" in node.value:
                found.add("shows data of the checks' MIME type")
            if node.value in EVENTS:
                found.add(f"registers an IPython event hook ({node.value})")
    return found | scan.found


def suspicious(cells: list[tuple[str, str]], names: Names) -> list[str]:
    """What the student's cells (:func:`student_cells`) do that no honest answer needs, sorted.

    Walking the call stack, reading or changing ``sys.modules``, replacing anything of
    vitlab, using the grader's code, registering IPython event hooks, writing a check's
    ``PASS`` line or showing the checks' data, reading the environment, starting processes,
    running shell commands other than installs, writing outside the folder, searching the
    interpreter's objects. A changed release cell is judged on what its change added.
    Hints read from the code, not proof; they never change a score.
    """
    found: set[str] = set()
    for text, release in cells:
        found |= findings(text, names) - (findings(release, names) if release else set())
    return sorted(found)


# ---------------------------------------------------------------- copied vitlab objects


def resolve_object(name: str) -> Any:
    """The vitlab object a dotted name names (vitlab's own modules only), or ``None``."""
    parts = name.split(".")
    if parts[0] != "vitlab":
        return None
    for split in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attr in parts[split:]:
            obj = getattr(obj, attr, None)
        return obj
    return None


# The vitlab objects that answer a check whose reference is written in the check itself: a
# submission whose answer uses one of them for that exercise has copied the answer. (Chapter
# 12's mean_pool_rollout is built on vitlab's attention_rollout, as its solution is: not here.)
ANSWERED_BY: dict[str, tuple[str, ...]] = {
    "patchify": ("vitlab.layers.patch_embed.patchify",),
    "unpatchify": ("vitlab.layers.patch_embed.unpatchify",),
    "scaled_dot_product_attention": (
        "vitlab.layers.attention.explicit_attention",
        "vitlab.layers.attention.fused_attention",
    ),
    "layer_scale_init": ("vitlab.models.cait.layer_scale_init_for_depth",),
    "levit_bias_indices": ("vitlab.models.levit.attention_bias_index",),
    "levit_shrink_bias_indices": ("vitlab.models.levit.attention_bias_index",),
    "soft_distillation_loss": ("vitlab.distill.soft_distillation_loss",),
    "hard_distillation_loss": ("vitlab.distill.hard_distillation_loss",),
    "warmup_cosine": ("vitlab.train.warmup_cosine",),
    "pit_pooling_stage": ("vitlab.models.pit.Pooling",),
}


def reference_objects(reference: Callable[..., Any], check: str = "") -> list[Any]:
    """The vitlab objects a check's reference is: itself, or (defined in vitlab.checks) the vitlab
    functions and classes its code names, and those that answer ``check`` (:data:`ANSWERED_BY`)."""
    module = getattr(reference, "__module__", "") or ""
    if module.startswith("vitlab.") and not module.startswith("vitlab.checks"):
        return [reference]
    answers = [obj for name in ANSWERED_BY.get(check, ()) if (obj := resolve_object(name)) is not None]
    code = getattr(reference, "__code__", None)
    scope = getattr(reference, "__globals__", {})
    found = []
    stack = [code] if code is not None else []
    while stack:
        current = stack.pop()
        stack.extend(c for c in current.co_consts if hasattr(c, "co_names"))
        for name in current.co_names:
            obj = scope.get(name)
            owner = getattr(obj, "__module__", "") or ""
            if callable(obj) and owner.startswith("vitlab.") and not owner.startswith("vitlab.checks"):
                found.append(obj)
    return answers + found


def _definitions(trees: list[ast.Module]) -> dict[str, list[ast.AST]]:
    """``{name: [the statements that bind it at the top of a cell]}``, in order."""
    found: dict[str, list[ast.AST]] = {}
    for tree in trees:
        for statement in tree.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.setdefault(statement.name, []).append(statement)
            elif isinstance(statement, (ast.Import, ast.ImportFrom)):
                for alias in statement.names:
                    found.setdefault(alias.asname or alias.name.split(".")[0], []).append(statement)
            elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
                targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                for target in targets:
                    for node in ast.walk(target):
                        if isinstance(node, ast.Name):
                            found.setdefault(node.id, []).append(statement)
    return found


def vitlab_uses(cells: list[tuple[str, str]], names: Names, function: str | None = None) -> set[str]:
    """The dotted vitlab names the student's cells use; with ``function``, only those its answer reaches.

    The answer is what the student's cells bind to ``function`` (a ``def``, a class, an
    assignment), and every name it uses that the student's cells bind, followed to the end.
    """
    trees = []
    for text, _ in cells:
        try:
            trees.append(parse(text))
        except SyntaxError:
            continue
    if function is None:
        roots: list[ast.AST] = list(trees)
    else:
        defined, roots, seen, todo = _definitions(trees), [], set(), [function]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            for statement in defined.get(name, []):
                roots.append(statement)
                todo += [n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and n.id in defined]
    found = set()
    for root in roots:
        for _, name in _uses(root, names):
            if name.split(".")[0] == "vitlab" and "." in name:
                found.add(name)
    return found


def copied(cells: list[tuple[str, str]], names: Names, function: str, references: list[Any]) -> list[str]:
    """The vitlab names the student's answer to an exercise uses that are one of ``references``
    (:func:`reference_objects`), or a class built on one of them."""
    flagged = []
    for name in sorted(vitlab_uses(cells, names, function)):
        if name.startswith("vitlab.checks"):
            continue
        obj = resolve_object(name)
        if obj is None:
            continue
        if any(obj is r for r in references):
            flagged.append(name)
    return flagged


def ran(calls: Iterable[str], references: list[Any]) -> list[str]:
    """The ``references`` (:func:`reference_objects`) the answer ran, by the calls the grader's
    harness recorded in the kernel (``module.qualname``; a class counts when one of its methods ran)."""
    calls = set(calls)
    found = []
    for obj in references:
        name = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
        if name in calls or (isinstance(obj, type) and any(c.startswith(name + ".") for c in calls)):
            found.append(name)
    return found


def from_checks(cells: list[tuple[str, str]], names: Names) -> list[str]:
    """The names inside ``vitlab.checks`` (a check's private reference or machinery) the student's cells use."""
    return sorted(n for n in vitlab_uses(cells, names) if n.startswith("vitlab.checks.") and n.count(".") >= 2)


# ---------------------------------------------------------------- tripwires in the kernel

TRIPPED = "references-called"  # the file, in the grader's work folder, where a tripwire records its name
_armed: dict[str, str] = {}


def _tripped(name: str) -> None:
    """A tripwire went off: record it, then raise (the reference computes nothing)."""
    path = _armed.get("record")
    if path:
        try:
            with builtins.open(path, "a", encoding="utf-8") as handle:
                handle.write(name + "\n")
        except OSError:
            pass
    raise RuntimeError(f"{name} is one of the checks' references: not available while the notebook is graded")


def _tripwire(function: types.FunctionType, name: str) -> None:
    text = f"def tripwire(*args, **kwargs):\n    __import__({__name__!r}, fromlist=['_tripped'])._tripped({name!r})\n"
    namespace: dict[str, Any] = {}
    exec(compile(text, f"<vitlab_grader tripwire {name}>", "exec"), namespace)  # noqa: S102 - constant code
    code = namespace["tripwire"].__code__
    if len(function.__code__.co_freevars) == 0:
        function.__code__ = code.replace(co_name=function.__code__.co_name)
        function.__defaults__ = function.__kwdefaults__ = None


def arm(record: str) -> list[str]:
    """In a grading kernel, before any of the student's code: every function of ``vitlab.checks``
    (but ``vitlab.checks._core``, the grader's cell's machinery) becomes a tripwire that appends
    its name to ``record`` and raises. Classes the cases hold (a hand-made block) are left alone.
    The names armed."""
    _armed["record"] = record
    try:
        import vitlab.checks
    except ImportError:
        return []
    armed = []
    for module_name, module in sorted(sys.modules.items()):
        if not module_name.startswith("vitlab.checks.") or module_name == "vitlab.checks._core" or module is None:
            continue
        for attr, value in sorted(vars(module).items()):
            if isinstance(value, types.FunctionType) and value.__module__ == module_name:
                _tripwire(value, f"{module_name}.{attr}")
                armed.append(f"{module_name}.{attr}")
    for attr, value in vars(vitlab.checks).items():  # the public checks, re-exported
        if isinstance(value, types.FunctionType) and value.__module__.startswith("vitlab.checks."):
            armed.append(f"vitlab.checks.{attr}")
    return armed


def arm_line(folder: str) -> str:
    """The kernel's start-up line (IPython's ``exec_lines``) that arms the tripwires, binding no name."""
    record = os.path.join(folder, WORK, TRIPPED)
    return f"__import__({__name__!r}, fromlist=['arm']).arm({record!r})"


def read_tripped(folder: str | os.PathLike[str]) -> list[str]:
    """The tripwires that went off in a kernel whose folder is ``folder`` (what the record holds now)."""
    path = os.path.join(folder, WORK, TRIPPED)
    try:
        with builtins.open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(65536)
    except OSError:
        return []
    return list(dict.fromkeys(line.strip()[:200] for line in text.splitlines() if line.strip()))
