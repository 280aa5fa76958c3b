"""vitlab_grader.ids: student ids from Moodle and Canvas exports, folders, names, patterns; no merges."""

from __future__ import annotations

from pathlib import Path

import pytest

from vitlab_grader.ids import StudentIdError, student_ids


def _ids(root: Path, *names: str, **options: str) -> dict[str, str]:
    """``{relative path: id}`` for files ``names`` created under ``root``."""
    paths = []
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}", encoding="utf-8")
        paths.append(path)
    found = student_ids(paths, root=root, **options)
    return {path.relative_to(root).as_posix(): found[path] for path in paths}


def test_moodle_per_student_folders_give_the_participant_ids(tmp_path: Path) -> None:
    """Two un-renamed 09_pit.ipynb in Moodle's folders: two students, never one merged row."""
    found = _ids(
        tmp_path,
        "Jane Doe_123456_assignsubmission_file_/09_pit.ipynb",
        "John Smith_123457_assignsubmission_file_/09_pit.ipynb",
        "Team A-Ann Lee_20001_assignsubmission_file_/09_pit.ipynb",  # a group submission
        "Participant_98765_assignsubmission_file_/09_pit.ipynb",  # blind marking
        "Bob Ray_555_assignsubmission_file_09_pit.ipynb",  # without "download submissions in folders"
    )
    assert list(found.values()) == ["123456", "123457", "20001", "98765", "555"]
    assert _ids(tmp_path, "Jane Doe_123456_assignsubmission_file_/09_pit.ipynb", source="moodle") == {
        "Jane Doe_123456_assignsubmission_file_/09_pit.ipynb": "123456"
    }
    # one submission alone (its own folder is the root): still the participant id
    one = tmp_path / "Jane Doe_123456_assignsubmission_file_" / "09_pit.ipynb"
    assert student_ids([one]) == {one: "123456"}


def test_canvas_file_names_give_the_user_ids(tmp_path: Path) -> None:
    found = _ids(
        tmp_path,
        "doejane_12345_6789012_09_pit.ipynb",
        "smithjohn_LATE_12346_6789013_09_pit.ipynb",
        "leeann_12347_6789014_09_pit-1.ipynb",  # a resubmission under the same name
        "anon_Xy7Q2_6789015_09_pit.ipynb",  # an anonymous assignment
        "LATE_anon_Zk3P9_6789016_09_pit.ipynb",
    )
    assert list(found.values()) == ["12345", "12346", "12347", "anon_Xy7Q2", "anon_Zk3P9"]
    with pytest.raises(StudentIdError, match="Canvas file name"):
        _ids(tmp_path, "s1234_09_pit.ipynb", source="canvas")


def test_per_student_folders_and_file_names(tmp_path: Path) -> None:
    assert _ids(tmp_path / "a", "s1234/09_pit.ipynb", "s5678/09_pit.ipynb") == {
        "s1234/09_pit.ipynb": "s1234",
        "s5678/09_pit.ipynb": "s5678",
    }
    assert _ids(tmp_path / "b", "s1234_09_pit.ipynb", "jdoe.ipynb", "Copy of kim (2).ipynb") == {
        "s1234_09_pit.ipynb": "s1234",
        "jdoe.ipynb": "jdoe",
        "Copy of kim (2).ipynb": "kim",
    }
    # "file" ignores the folders; "folder" requires one
    assert _ids(tmp_path / "c", "x/s1_09_pit.ipynb", "y/s2_09_pit.ipynb", source="file") == {
        "x/s1_09_pit.ipynb": "s1",
        "y/s2_09_pit.ipynb": "s2",
    }
    with pytest.raises(StudentIdError, match="per-student folder"):
        _ids(tmp_path / "d", "s1_09_pit.ipynb", source="folder")


def test_copies_in_one_folder_are_a_collision_not_two_students(tmp_path: Path) -> None:
    with pytest.raises(StudentIdError) as error:
        _ids(tmp_path, "09_pit (1).ipynb", "Copy of 09_pit.ipynb")
    message = str(error.value)
    assert "09_pit (1).ipynb" in message and "Copy of 09_pit.ipynb" in message and "'09_pit'" in message


def test_collisions_name_both_files(tmp_path: Path) -> None:
    with pytest.raises(StudentIdError, match=r"s1234_09_pit\.ipynb.*s1234_10_levit\.ipynb.*'s1234'"):
        _ids(tmp_path / "a", "s1234_09_pit.ipynb", "s1234_10_levit.ipynb")
    with pytest.raises(StudentIdError, match="both get student id '12345'"):
        _ids(tmp_path / "b", "doejane_12345_1_09_pit.ipynb", "doejane_LATE_12345_2_09_pit.ipynb")


def test_pattern(tmp_path: Path) -> None:
    assert _ids(tmp_path / "a", "07_t2t_vit-jdoe.ipynb", "07_t2t_vit-akim.ipynb", pattern=r"-(\w+)\.ipynb$") == {
        "07_t2t_vit-jdoe.ipynb": "jdoe",
        "07_t2t_vit-akim.ipynb": "akim",
    }
    # searched in the path under root, so a pattern can read folders too
    found = _ids(tmp_path / "b", "section1/u17/nb.ipynb", "section2/u18/nb.ipynb", pattern=r"/(?P<id>u\d+)/")
    assert list(found.values()) == ["u17", "u18"]
    with pytest.raises(StudentIdError, match="no student id in .*nb.ipynb"):
        _ids(tmp_path / "c", "nb.ipynb", pattern=r"(?P<id>u\d+)")
    with pytest.raises(ValueError, match="group named 'id'"):
        _ids(tmp_path / "d", "nb.ipynb", pattern=r"u\d+")
    with pytest.raises(ValueError, match="regular expression"):
        _ids(tmp_path / "e", "nb.ipynb", pattern=r"(?P<id>")
    with pytest.raises(ValueError, match="needs a pattern"):
        _ids(tmp_path / "f", "nb.ipynb", source="pattern")


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="source must be one of .* got 'lms'"):
        student_ids([tmp_path / "a.ipynb"], source="lms")
    with pytest.raises(ValueError, match="inside root"):
        student_ids([tmp_path / "a.ipynb"], root=tmp_path / "elsewhere")
    assert student_ids([]) == {}
    assert not issubclass(StudentIdError, KeyError) and issubclass(StudentIdError, ValueError)


COPIES = ("09_pit copy.ipynb", "09_pit copy 2.ipynb", "09_pit-1.ipynb", "09_pit (1).ipynb", "Copy of 09_pit.ipynb",
          "09_pit - Copy.ipynb", "Copy of 09_pit (2).ipynb")  # fmt: skip


def test_one_parser_and_one_set_of_copy_rules(tmp_path: Path) -> None:
    """Bug 5: ``student_id`` gave ``jane`` where the grader's ids gave ``jane_doe``, and the release
    matching and the ids each knew copy decorations the other did not (`` copy``, ``-1``)."""
    from vitlab_grader import Release, student_id
    from vitlab_grader.release import match_release

    path = tmp_path / "jane_doe_09_pit.ipynb"
    assert student_id(path) == student_ids([path])[path] == "jane_doe"
    assert student_id(tmp_path / "2024-0042.ipynb") == "2024-0042"  # a number after a dash and a digit: no copy
    releases = [Release(name, tmp_path / f"{name}.ipynb", {}, ()) for name in ("07_t2t_vit", "09_pit")]
    for name in COPIES:
        assert student_id(tmp_path / name) == "09_pit", name  # the file's name, undecorated
        release, anomalies = match_release(tmp_path / name, {"metadata": {}}, releases)
        assert release is not None and release.name == "09_pit" and anomalies == [], name
