"""vitlab_grader.isolation: a graded kernel sees its folder, an allowlisted environment, and no more.

Real kernels, one per sandbox kind, each running one notebook that tries what issue 19's
attackers did: read a classmate's notebook beside its folder and the course checkout,
write outside its folder, read the instructor's environment, and leave a detached
process behind. The bubblewrap tests skip where ``bwrap`` cannot start, except with
``VITLAB_REQUIRE_SANDBOX=1`` (CI), where they fail.
"""

from __future__ import annotations

import json
import os
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

import pytest
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

from vitlab_grader import isolation
from vitlab_grader.isolation import (
    ENV_ALLOWLIST,
    end_processes,
    isolated_kernel_manager,
    scrubbed_env,
    submission_folder,
)

ROOT = Path(__file__).resolve().parents[1]
SECRET = "SECRET_TOKEN_qzx_4711"
WAKE_SECONDS = 1.0  # a detached process still alive writes its file within this long of "go"

# One cell: every probe, printed as one JSON line (the kernel's view of the machine).
PROBE = """
import importlib.util, json, os, subprocess, sys
def can_read(path):
    try:
        with open(path, 'rb') as handle:
            handle.read(1)
        return True
    except OSError:
        return False
def can_write(path):
    try:
        with open(path, 'w') as handle:
            handle.write('overwritten')
        return True
    except OSError:
        return False
def can_join(procs):  # move this process into the cgroup of that cgroup.procs file
    try:
        with open(procs, 'w') as handle:
            handle.write(str(os.getpid()))
        return True
    except OSError:
        return False
def can_list(path):
    try:
        os.listdir(path)
        return True
    except OSError:
        return False
# a process in a session of its own, and one orphaned by a double fork
# each writes its file once the grader (the test) creates "go" in the folder
script = ("import os, sys, time; open(sys.argv[1] + '.started', 'w').close()\\n"
          "while not os.path.exists('go'): time.sleep(0.05)\\n"
          "open(sys.argv[1], 'w').close()")
subprocess.Popen([sys.executable, '-c', script, 'detached'], start_new_session=True)
subprocess.Popen(['sh', '-c', 'setsid "$0" -c "$1" orphan &', sys.executable, script])
import time
deadline = time.monotonic() + 20
while not all(os.path.exists(n + '.started') for n in ('detached', 'orphan')) and time.monotonic() < deadline:
    time.sleep(0.05)
while not os.path.exists('counted') and time.monotonic() < deadline:  # the test counts the processes
    time.sleep(0.05)
print(json.dumps({{
    "cwd": os.getcwd(), "home": os.path.expanduser('~'), "env": sorted(os.environ),
    "secret": {secret!r} in repr(os.environ),
    "classmate": can_read({classmate!r}), "classmate_listed": can_list({parent!r}) and
        os.path.basename({classmate!r}) in os.listdir({parent!r}),
    "checkout_notebooks": can_list({notebooks!r}), "readme": can_read({readme!r}),
    "overwrite_classmate": can_write({classmate!r}), "write_beside": can_write({beside!r}),
    "write_usr": can_write({usr_probe!r}), "write_here": can_write('mine.txt'),
    "vitlab": can_read(importlib.util.find_spec('vitlab').origin),
    "packages": [os.path.realpath(importlib.util.find_spec(m).origin) for m in ('vitlab', 'vitlab_grader')],
    "leave_cgroup": {leave!r} and any(can_join(f'/sys/fs/cgroup/{{c}}cgroup.procs') for c in ('cpu/', 'unified/', '')),
}}))
"""


def _sandbox_or_skip(name: str) -> None:
    """Skip, saying why, where ``name`` cannot start; for bubblewrap with VITLAB_REQUIRE_SANDBOX=1 (CI), fail.

    The unshare sandbox is the fallback: it always skips where it cannot start.
    """
    isolation._available.cache_clear()
    why = isolation._available(name)
    if not why:
        return
    if name == "bubblewrap" and os.environ.get("VITLAB_REQUIRE_SANDBOX") == "1":
        pytest.fail(f"{why}, and VITLAB_REQUIRE_SANDBOX=1 requires the sandbox tests", pytrace=False)
    pytest.skip(why)


def _grade_attack(
    monkeypatch: pytest.MonkeyPatch, *, sandbox: bool, shutdown: bool
) -> tuple[dict, Path, isolation.Isolation]:
    """Run the probe notebook in an isolated kernel; ``(what it saw, its folder, the isolation)``.

    ``shutdown``: nbclient shuts the kernel down before :func:`end_processes` (as the grader
    does); otherwise the kernel is still running when end_processes is called.
    """
    monkeypatch.setenv(SECRET, "hunter2")
    env = scrubbed_env({"VITLAB_CHECK_DATA": "1"})
    parent = Path(tempfile.gettempdir())
    classmate = parent / f"classmate-{os.getpid()}-09_pit.ipynb"  # a classmate's submission beside the folder
    classmate.write_text("classmate's answers", encoding="utf-8")
    try:
        with submission_folder({"09_pit.ipynb": b"{}"}) as folder:
            source = PROBE.format(
                secret=SECRET, classmate=str(classmate), parent=str(parent),
                notebooks=str(ROOT / "notebooks"), readme=str(ROOT / "README.md"),
                beside=str(parent / f"beside-{os.getpid()}.txt"),
                usr_probe="/usr/lib/vitlab-probe" if sandbox else "",  # root without a sandbox could write it
                leave=sandbox,  # root without a sandbox could leave its cgroup (the module's docstring says so)
            )  # fmt: skip
            notebook = new_notebook(cells=[new_code_cell(source)])
            km, how = isolated_kernel_manager(folder, env, sandbox=sandbox)
            client = NotebookClient(notebook, km=km, timeout=60, kernel_name="python3")
            counted: dict[str, list[int]] = {}
            counter = threading.Thread(target=_count_processes, args=(folder, km, counted), daemon=True)
            counter.start()
            try:
                client.execute(cleanup_kc=shutdown)
                started = all((folder / f"{n}.started").exists() for n in ("detached", "orphan"))
            finally:
                end_processes(km)
                counter.join()
            (folder / "go").touch()
            time.sleep(WAKE_SECONDS)
            outputs = notebook.cells[0].outputs
            assert outputs and outputs[0].get("name") == "stdout", outputs
            seen = json.loads(outputs[0]["text"].strip().splitlines()[-1])
            seen["detached_started"] = started
            seen |= counted
            seen["cgroup_left"] = km._cgroup is not None and km._cgroup.exists()  # type: ignore[attr-defined]
            seen["detached_wrote"] = (folder / "detached").exists() or (folder / "orphan").exists()
            seen["wrote_here"] = (folder / "mine.txt").exists()
            seen["classmate_after"] = classmate.read_text(encoding="utf-8")
            seen["folder"] = str(folder)
            seen["beside_after"] = (parent / f"beside-{os.getpid()}.txt").exists()
        return seen, folder, how
    finally:
        classmate.unlink(missing_ok=True)
        (parent / f"beside-{os.getpid()}.txt").unlink(missing_ok=True)


def _cwd(pid: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def _count_processes(folder: Path, km: AsyncKernelManager, counted: dict[str, list[int]]) -> None:
    """Once the probe's detached processes have started (the probe waits for "counted"): the
    processes working in the folder (the kernel and the detached ones), and those in the kernel's cgroup."""
    deadline = time.monotonic() + 60
    while not all((folder / f"{n}.started").exists() for n in ("detached", "orphan")):
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)
    counted["in_folder"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and _cwd(p) == str(folder))
    counted["in_cgroup"] = sorted(isolation._cgroup_processes(km._cgroup))  # type: ignore[attr-defined]
    (folder / "counted").touch()


def _assert_cpu_share(seen: dict, how: isolation.Isolation) -> None:
    """Where cgroups can be made, the kernel and all it started share one, removed at the end."""
    cgroups, kind = isolation.cpu_cgroups()
    if cgroups is None:
        assert how.cpu_share == f"none: {kind}"
        return
    assert how.cpu_share == kind
    assert len(seen["in_folder"]) >= 3, f"the kernel and its detached processes were not found: {seen['in_folder']}"
    assert set(seen["in_folder"]) <= set(seen["in_cgroup"]), seen
    assert not seen["cgroup_left"]


def _assert_env_folder_processes(seen: dict) -> None:
    """What every kind of isolation gives: folder, allowlisted environment, no process left."""
    assert seen["cwd"] == seen["folder"] and seen["home"] == seen["folder"]
    assert not seen["secret"]
    # the kernel's own additions (ipykernel sets these when it starts) are not the grader's
    ipykernel_sets = {"CLICOLOR", "CLICOLOR_FORCE", "FORCE_COLOR", "GIT_PAGER", "MPLBACKEND", "PAGER", "TERM",
                      "PYDEVD_USE_FRAME_EVAL", "PWD", "LC_CTYPE"}  # fmt: skip
    assert set(seen["env"]) - ipykernel_sets <= set(ENV_ALLOWLIST) | {"VITLAB_CHECK_DATA"}
    # the kernel imports the grader's own vitlab and vitlab_grader (the harness), wherever they are
    import vitlab
    import vitlab_grader

    assert seen["packages"] == [os.path.realpath(vitlab.__file__), os.path.realpath(vitlab_grader.__file__)]
    assert seen["write_here"] and seen["vitlab"]
    assert not seen["write_usr"]
    assert seen["detached_started"], "the probe's detached processes never started: the test proves nothing"
    assert not seen["detached_wrote"], "a detached process outlived end_processes"


def test_scrubbed_env_keeps_only_the_allowlist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET, "hunter2")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("HOME", "/root-of-the-grader")
    monkeypatch.setenv("PATH", "/grader/secret/bin:/usr/bin")
    monkeypatch.setenv("PYTHONPATH", "/grader/secret/lib")
    env = scrubbed_env({"VITLAB_CHECK_DATA": "1"})
    assert SECRET not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["LANG"] == "C.UTF-8" and env["VITLAB_CHECK_DATA"] == "1"
    assert "HOME" not in env  # set to the folder by isolated_kernel_manager
    assert "/grader/secret" not in env["PATH"] and "/grader/secret" not in env.get("PYTHONPATH", "")
    assert set(env) <= set(ENV_ALLOWLIST) | {"VITLAB_CHECK_DATA"}
    with pytest.raises(TypeError, match="str to str"):
        scrubbed_env({"N": 1})  # type: ignore[dict-item]


def test_the_kernel_finds_the_graders_packages_in_a_checkout_or_installed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A checkout (PYTHONPATH, editable install): its two folders on the kernel's PYTHONPATH and
    bound into the sandbox; installed into the environment (pip install): nothing to add."""
    checkout = [tmp_path / "vitlab", tmp_path / "grader" / "vitlab_grader"]
    monkeypatch.setattr(isolation, "_package_dirs", lambda: checkout)
    assert scrubbed_env()["PYTHONPATH"] == os.pathsep.join([str(tmp_path), str(tmp_path / "grader")])
    _, binds = isolation._readonly_paths()
    assert {str(checkout[0]), str(checkout[1])} <= set(binds) and str(tmp_path) not in binds
    site = Path(sysconfig.get_paths()["purelib"])
    monkeypatch.setattr(isolation, "_package_dirs", lambda: [site / "vitlab", site / "vitlab_grader"])
    assert "PYTHONPATH" not in scrubbed_env()


def test_submission_folder_holds_only_its_files_and_is_removed() -> None:
    with submission_folder({"09_pit.ipynb": b"{}", "data.csv": b"1,2", "data/w.pt": b"w"}) as folder:
        assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
            "09_pit.ipynb",
            "data.csv",
            "data/w.pt",
        ]
        assert (folder / "data.csv").read_bytes() == b"1,2" and (folder / "data" / "w.pt").read_bytes() == b"w"
    assert not folder.exists()
    for bad in ("../x.ipynb", "a/../../b.ipynb", "/etc/x", "a//b", "..", "", "a\\b"):
        with pytest.raises(ValueError, match="plain file names"):
            with submission_folder({bad: b""}):
                pass
    with pytest.raises(TypeError, match="bytes"):
        with submission_folder({"a.ipynb": "text"}):  # type: ignore[dict-item]
            pass


@pytest.mark.slow
def test_bubblewrap_hides_the_machine_and_ends_every_process(monkeypatch: pytest.MonkeyPatch) -> None:
    _sandbox_or_skip("bubblewrap")
    seen, _, how = _grade_attack(monkeypatch, sandbox=True, shutdown=True)
    assert (how.sandbox, how.note) == ("bubblewrap", "")
    _assert_env_folder_processes(seen)
    _assert_cpu_share(seen, how)
    assert not seen["leave_cgroup"], "the sandboxed kernel could move itself out of its cgroup"
    assert not seen["classmate"] and not seen["classmate_listed"]
    assert not seen["checkout_notebooks"] and not seen["readme"]
    # writes outside the folder land in the sandbox's private /tmp (gone with it), never on the machine
    assert seen["classmate_after"] == "classmate's answers" and not seen["beside_after"]


@pytest.mark.slow
def test_unshare_sandbox_hides_the_machine_and_ends_every_process(monkeypatch: pytest.MonkeyPatch) -> None:
    _sandbox_or_skip("unshare")
    original = isolation._available
    monkeypatch.setattr(isolation, "_available", lambda name: "off" if name == "bubblewrap" else original(name))
    seen, _, how = _grade_attack(monkeypatch, sandbox=True, shutdown=False)
    assert (how.sandbox, how.note) == ("unshare", "")
    _assert_env_folder_processes(seen)
    assert not seen["classmate"] and not seen["checkout_notebooks"] and not seen["readme"]
    assert seen["classmate_after"] == "classmate's answers" and not seen["beside_after"]


@pytest.mark.slow
def test_without_sandbox_env_folder_and_processes_are_still_isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    seen, _, how = _grade_attack(monkeypatch, sandbox=False, shutdown=False)
    assert how.sandbox == "none" and "file isolation unavailable" in how.note
    _assert_env_folder_processes(seen)
    _assert_cpu_share(seen, how)
    assert seen["classmate"]  # what the note warns about: no file isolation without a sandbox


def test_no_sandbox_starts_gives_none_with_the_reasons(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(isolation, "_available", lambda name: f"{name} is broken here")
    km, how = isolated_kernel_manager(tmp_path, scrubbed_env())
    assert how.sandbox == "none"
    assert how.note == "file isolation unavailable: bubblewrap is broken here; unshare is broken here"
    end_processes(km)  # never started: nothing to do, and no error


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", [True, False], ids=["sandbox", "no-sandbox"])
def test_restart_and_end_processes_twice(sandbox: bool) -> None:
    """The grader restarts a stuck kernel: the new one is isolated too, and ending is idempotent."""
    import asyncio

    async def run(km: AsyncKernelManager) -> list[str]:
        answers = []
        await km.start_kernel()
        for _ in range(2):
            client = km.client()
            client.start_channels()
            await client.wait_for_ready(timeout=60)
            reply = await client.execute_interactive(f"import os; assert os.getcwd() == {str(folder)!r}", timeout=30)
            assert reply["content"]["status"] == "ok", reply["content"]
            answers.append(str(km.connection_file))
            client.stop_channels()
            if len(answers) == 1:
                await km.restart_kernel(now=True)
        await km.shutdown_kernel(now=True)
        return answers

    with submission_folder({}) as folder:
        km, how = isolated_kernel_manager(folder, scrubbed_env(), sandbox=sandbox)
        assert sandbox or how.sandbox == "none"
        asyncio.run(run(km))
        end_processes(km)
        end_processes(km)
        assert not Path(km.connection_file).parent.exists()  # the private runtime folder is gone


def test_end_processes_rejects_other_managers() -> None:
    with pytest.raises(TypeError, match="isolated_kernel_manager"):
        end_processes(AsyncKernelManager())


def test_folder_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="existing absolute folder"):
        isolated_kernel_manager(tmp_path / "missing", {})


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", [True, False], ids=["sandbox", "no-sandbox"])
def test_the_kernel_runs_under_its_memory_process_and_priority_limits(sandbox: bool) -> None:
    """RLIMIT_DATA and nice always; RLIMIT_NPROC only in a sandbox (its own user counts the processes)."""
    import asyncio

    from vitlab_grader.isolation import Limits

    limits = Limits(memory=3 * 2**30, processes=200, nice=7)

    async def run(km: AsyncKernelManager, code: str) -> dict:
        await km.start_kernel()
        client = km.client()
        client.start_channels()
        await client.wait_for_ready(timeout=60)
        reply = await client.execute_interactive(code, timeout=30)
        client.stop_channels()
        await km.shutdown_kernel(now=True)
        return reply["content"]

    with submission_folder({}) as folder:
        km, how = isolated_kernel_manager(folder, scrubbed_env(), sandbox=sandbox, limits=limits)
        processes = 200 if how.sandbox != "none" else -1  # RLIM_INFINITY reads as -1
        code = (
            "import os, resource\n"
            f"assert resource.getrlimit(resource.RLIMIT_DATA) == ({3 * 2**30}, {3 * 2**30})\n"
            f"assert {processes} == -1 or resource.getrlimit(resource.RLIMIT_NPROC)[0] == {processes}\n"
            "assert os.nice(0) >= 7, os.nice(0)\n"
            "try:\n    bytearray(4 * 2**30)\nexcept MemoryError:\n    pass\nelse:\n    raise AssertionError('no limit')"
        )
        try:
            content = asyncio.run(run(km, code))
        finally:
            end_processes(km)
        assert content["status"] == "ok", content


@pytest.mark.slow
def test_the_grader_drops_a_kernel_message_over_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """One print over MESSAGE_LIMIT (here lowered to 1 MiB) never reaches the grader; the kernel goes on
    (its later outputs are lost with the connection: test_grade_robustness.py grades such a notebook)."""
    import asyncio
    import contextlib

    monkeypatch.setattr(isolation, "MESSAGE_LIMIT", 2**20)
    seen: list[dict] = []

    async def run(km: AsyncKernelManager) -> None:
        await km.start_kernel()
        client = km.client()
        client.start_channels()
        await client.wait_for_ready(timeout=60)
        with contextlib.suppress(TimeoutError):  # ZeroMQ drops the output connection, and the cell's idle status
            await client.execute_interactive("print('y' * 2**21)", timeout=3, output_hook=seen.append)
        client.execute("assert len('y' * 2**21) == 2**21")  # the kernel still runs cells and answers
        reply = await client.get_shell_msg(timeout=30)
        assert reply["content"]["status"] == "ok", reply["content"]
        client.stop_channels()
        await km.shutdown_kernel(now=True)

    with submission_folder({}) as folder:
        km, _ = isolated_kernel_manager(folder, scrubbed_env())
        try:
            asyncio.run(run(km))
        finally:
            end_processes(km)
    printed = [len(m["content"]["text"]) for m in seen if m["msg_type"] == "stream"]
    assert all(size < 2**20 for size in printed), f"a message of {max(printed)} characters arrived"
