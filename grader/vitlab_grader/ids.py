"""Student ids for submissions, as learning management systems export them; never two students merged.

Usage (the grader)::

    from vitlab_grader.ids import StudentIdError, student_id, student_ids

    ids = student_ids(paths, root=submissions_folder)  # {path: "123456", ...}
    # raises StudentIdError (a ValueError) naming both files when two get the same id
    student_id("subs/jane_doe_09_pit.ipynb")  # "jane_doe": one path, the same rules

This module is the grader's only reader of names: :func:`undecorated` (the copy rules
below) is also what :func:`vitlab_grader.release.match_release` uses to find the release
notebook a file answers.

``source`` says where an id comes from:

``"auto"`` (default), the first that applies to a path:

1. **Moodle** (``"moodle"``): "Download all submissions" of an assignment zips one folder
   per student and plugin, ``<Full Name>_<participant id>_assignsubmission_file_``,
   holding the files under their own names (``Jane Doe_123456_assignsubmission_file_/
   09_pit.ipynb`` is ``123456``); with "Download submissions in folders" off (and before
   Moodle 3.1) the same prefix is on each file name instead (``Jane Doe_123456_
   assignsubmission_file_09_pit.ipynb``). Blind marking writes ``Participant`` for the
   name, group submissions ``<group>-<name>``. The number is the participant identifier
   of the assignment, the one in the "Identifier" column ("Participant 123456") of its
   offline grading worksheet. Source: ``mod/assign/locallib.php``,
   ``assign::download_submissions()`` (moodle/moodle): ``$prefix = clean_filename(
   str_replace('_', ' ', $groupname . fullname($student)) . '_' .
   $this->get_uniqueid_for_user($userid))``, then ``$prefix . '_' . $subtype . '_' .
   $type . '_'`` as a folder (``$downloadasfolders``, the default since 3.1) or as the
   start of each file name. The whole path is searched, nearest folder first, so a
   single submission graded alone keeps its id.
2. **Canvas** (``"canvas"``): "Download Submissions" zips every file flat, renamed
   ``<sortable name>_[LATE_]<user id>_<attachment id>_<file name>``, the name lower-cased
   with everything but letters and digits removed (``doejane_12345_6789012_09_pit.ipynb``
   and ``doejane_LATE_12345_6789012_09_pit.ipynb`` are ``12345``); an anonymous
   assignment writes ``anon_<anonymous id>`` for the name and user id (that is the id
   then). A file a student submitted twice under the same name keeps Canvas's ``-1``
   suffix (``..._09_pit-1.ipynb``); it does not change the id. Source:
   ``lib/content_zipper.rb``, ``ContentZipper#get_filename`` and
   ``#add_upload_submission`` (instructure/canvas-lms):
   ``[users_name, submission.late? ? "LATE" : nil, id].compact.join("_")`` then
   ``"#{filename}_#{file.id}_#{display_name}"``; the same layout is shown by the
   ``canvas-unzipper`` tool's README (``smithbob_340934_208490284_BobsWork.zip``).
3. **A per-student folder** (``"folder"``): the first folder of the path under ``root``
   (``root/s1234/09_pit.ipynb`` is ``s1234``).
4. **The file name** (``"file"``): the course's convention ``<id>_<NN>_<chapter>.ipynb``
   (``s1234_09_pit.ipynb`` is ``s1234``), else the whole name without ``.ipynb``.
   Decorations that copying adds are removed first (:func:`undecorated`): ``Copy of ``
   (Google Drive), `` (1)`` (browsers, Drive), `` - Copy`` (Windows), `` copy``/`` copy 2``
   (macOS), ``-1`` after a letter (Canvas's second file of one name; ``2024-0042`` keeps
   its number).

``"pattern"`` (or any ``pattern`` given): the regular expression ``pattern`` is searched in
the path relative to ``root`` (``/``-separated, ``.ipynb`` kept); the id is its group
``id``, else its group 1. A path it does not match is an error.

``root`` defaults to the deepest folder holding every path.

Two paths with the same id raise :class:`StudentIdError`, naming both: the gradebook has
one row per student and must never merge two (:func:`checked_student_ids` reports them
for those paths only, and the grader grades the rest). So ``09_pit (1).ipynb`` and
``Copy of 09_pit.ipynb`` side by side in one folder are an error (both are ``09_pit``:
the same student's copies, or two students the export cannot tell apart; either way the
instructor decides), while two un-renamed ``09_pit.ipynb`` in two per-student folders
get the two folders' ids.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

SOURCES = ("auto", "moodle", "canvas", "folder", "file", "pattern")

# "<Full Name>_<participant id>_assignsubmission_<plugin>_" (a folder, or the start of a file name)
_MOODLE = re.compile(r"^(?P<name>.+?)_(?P<id>\d+)_assignsubmission_(?P<plugin>[a-z0-9]+)_(?P<rest>.*)$", re.DOTALL)
# "<sortablename>_[LATE_]<user id>_<attachment id>_<file name>", or "[LATE_]anon_<anonymous id>_..."
_CANVAS = re.compile(
    r"^(?:(?!LATE_)(?P<name>[^\W_]+)_)?(?:LATE_)?(?P<id>\d+|anon_[A-Za-z0-9]+)_(?P<attachment>\d+)_(?P<rest>.+)$"
)
_CONVENTION = re.compile(r"^(?P<id>.+?)_\d{2}_[^_].*$")  # "s1234_09_pit" -> "s1234"
# What copying a file adds to its name: the one set of rules for ids and for release names.
COPY_DECORATIONS = (
    re.compile(r"^Copy of ", re.IGNORECASE),  # Google Drive
    re.compile(r" \(\d+\)$"),  # browsers, Google Drive: "09_pit (1)"
    re.compile(r" - Copy(?: \(\d+\))?$", re.IGNORECASE),  # Windows Explorer
    re.compile(r" copy(?: \d+)?$", re.IGNORECASE),  # macOS Finder: "09_pit copy", "09_pit copy 2"
    re.compile(r"(?<=[^\W\d_])-\d+$"),  # Canvas, a file submitted twice: "09_pit-1" (not "2024-0042")
)


class StudentIdError(ValueError):
    """No student id can be found for a submission, or two submissions get the same one."""


def undecorated(name: str) -> str:
    """``name`` without ``.ipynb`` and what copying adds, repeatedly: ``Copy of 09_pit (1).ipynb`` is ``09_pit``."""
    stem = _stem(name)
    while True:
        before = stem
        for decoration in COPY_DECORATIONS:
            stem = decoration.sub("", stem).strip()
        if stem == before:
            return stem


def _stem(name: str) -> str:
    return name[: -len(".ipynb")] if name.lower().endswith(".ipynb") else name


def _moodle(path: Path) -> str | None:
    """The participant id of a Moodle export path (the outermost folder or file name that has one), or ``None``.

    The whole path is read, not only what is below ``root``: Moodle's folder names are
    recognisable, and a single submission's root is its own folder. The outermost name
    counts: Moodle's folder is the uploader's, a file named like another student's inside
    it is still the uploader's.
    """
    for part in Path(os.path.abspath(path)).parts:
        match = _MOODLE.match(part)
        if match is not None:
            return match.group("id")
    return None


def _canvas(name: str) -> str | None:
    match = _CANVAS.match(name)
    return match.group("id") if match is not None else None


def _folder(parts: tuple[str, ...]) -> str | None:
    return (parts[0].strip() or None) if len(parts) > 1 else None


def _file(name: str) -> str | None:
    stem = undecorated(name)
    match = _CONVENTION.match(stem)
    return (match.group("id") if match is not None else stem) or None


def _compile(pattern: str) -> re.Pattern[str]:
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"pattern must be a regular expression, got {pattern!r}: {exc}") from exc
    if "id" not in compiled.groupindex and compiled.groups == 0:
        raise ValueError(f"pattern must have a group named 'id' (or a group 1), got {pattern!r}")
    return compiled


def _from_pattern(compiled: re.Pattern[str], relative: str) -> str | None:
    match = compiled.search(relative)
    if match is None:
        return None
    found = match.group("id") if "id" in compiled.groupindex else match.group(1)
    return found or None


def common_root(paths: Sequence[Path]) -> Path:
    """The deepest folder holding every path (the default ``root``)."""
    parents = [os.path.abspath(Path(p).parent) for p in paths]
    return Path(os.path.commonpath(parents)) if parents else Path.cwd()


def checked_student_ids(
    paths: Sequence[Path], *, root: Path | None = None, source: str = "auto", pattern: str | None = None
) -> tuple[dict[Path, str], dict[Path, str]]:
    """``(ids, problems)``: the id of each path that has one of its own, and why the others have none.

    As :func:`student_ids`, but a path without an id, or with an id another path also
    gets (both are named, and neither is given it), is a problem of those paths only:
    the rest of the export is graded.

    Raises:
        ValueError: an unknown ``source``, a ``pattern`` that is not a regular expression
            or has no group, a path outside ``root``.
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    if source == "pattern" and pattern is None:
        raise ValueError("source 'pattern' needs a pattern (a regular expression with a group 'id')")
    compiled = _compile(pattern) if pattern is not None else None
    paths = [Path(p) for p in paths]
    if not paths:
        return {}, {}
    base = Path(os.path.abspath(root)) if root is not None else common_root(paths)
    found_ids: dict[Path, str] = {}
    problems: dict[Path, str] = {}
    owners: dict[str, list[Path]] = {}
    for path in paths:
        try:
            relative = PurePosixPath(Path(os.path.abspath(path)).relative_to(base).as_posix())
        except ValueError:
            raise ValueError(f"every path must be inside root {str(base)!r}, got {str(path)!r}") from None
        parts = relative.parts
        if compiled is not None:
            found, where = _from_pattern(compiled, str(relative)), f"pattern {compiled.pattern!r}"
        elif source == "moodle":
            found, where = _moodle(path), "a Moodle folder or file name (<name>_<id>_assignsubmission_file_)"
        elif source == "canvas":
            found, where = _canvas(relative.name), "a Canvas file name (<name>_<user id>_<file id>_<file>)"
        elif source == "folder":
            found, where = _folder(parts), f"a per-student folder under {str(base)!r}"
        elif source == "file":
            found, where = _file(relative.name), "the file name"
        else:
            found = _moodle(path) or _canvas(relative.name) or _folder(parts) or _file(relative.name)
            where = "the path"
        if found is None:
            problems[path] = f"no student id in {str(relative)!r}: expected {where}"
            continue
        owners.setdefault(found, []).append(path)
        found_ids[path] = found
    for found, owned in owners.items():
        if len(owned) > 1:
            names = " and ".join(repr(str(p)) for p in owned)
            for path in owned:
                del found_ids[path]
                problems[path] = (
                    f"{names} {'both' if len(owned) == 2 else 'all'} get student id {found!r}: not graded; rename one, "
                    "or choose how ids are read (source, pattern)"
                )
    return found_ids, problems


def student_ids(
    paths: Sequence[Path], *, root: Path | None = None, source: str = "auto", pattern: str | None = None
) -> dict[Path, str]:
    """Each path's student id (the module's docstring says how), all different.

    Args:
        paths: the submissions.
        root: the folder the export was unpacked into (default: the deepest folder holding
            every path); per-student folders and ``pattern`` are read below it.
        source: ``"auto"``, ``"moodle"``, ``"canvas"``, ``"folder"``, ``"file"`` or ``"pattern"``.
        pattern: a regular expression with a group ``id`` (or a group 1), searched in the
            path relative to ``root``; given, it is used whatever ``source`` says.

    Raises:
        StudentIdError: a path has no id where ``source`` says, or two paths get the same
            id (both are named).
        ValueError: an unknown ``source``, a ``pattern`` that is not a regular expression
            or has no group, a path outside ``root``.
    """
    ids, problems = checked_student_ids(paths, root=root, source=source, pattern=pattern)
    if problems:
        raise StudentIdError(next(iter(problems.values())))
    return ids


def student_id(path: str | Path, *, source: str = "auto", pattern: str | None = None) -> str:
    """The student id of one submission, read as :func:`student_ids` reads it (``root``: its folder).

    ``jane_doe_09_pit.ipynb`` is ``jane_doe``; ``09_pit copy.ipynb`` is ``09_pit``.

    Raises:
        StudentIdError, ValueError: as :func:`student_ids`.
    """
    path = Path(path)
    return student_ids([path], source=source, pattern=pattern)[path]
