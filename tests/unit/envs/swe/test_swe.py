"""SWE environment logic without an engine: patches, edits, protected paths, tool text, scoring, git ids,
task rows, bug injection, issue reports, and the bundled task file."""

from __future__ import annotations

import ast
import json
import random
from collections import Counter
from pathlib import Path

import pytest

from agentrl.envs.swe import SweEnv, SweTask, gitobj, issues, load_jsonl, patches, protect, results, text
from agentrl.envs.swe.mutations import KINDS, find_mutations
from agentrl.envs.swe.repo import base_tree, clean_tree

OLD = {"pkg/a.py": "x = 1\ny = 2\nz = 3\n" * 4, "pkg/b.py": "no newline", "gone.py": "bye\n"}
NEW = {"pkg/a.py": OLD["pkg/a.py"].replace("y = 2", "y = 20", 1), "pkg/b.py": "no newline!", "c.py": "new\n"}

GIT_DIFF = """diff --git a/b.py b/b.py
deleted file mode 100644
index 6fe2aa3..0000000
--- a/b.py
+++ /dev/null
@@ -1 +0,0 @@
-no newline!
\\ No newline at end of file
diff --git a/c.py b/c.py
index 3e75765..c1a7792 100644
--- a/c.py
+++ b/c.py
@@ -1 +1,2 @@
 new
+q
diff --git "a/sp ace/t\\303\\251.py" "b/sp ace/t\\303\\251.py"
new file mode 100644
--- /dev/null
+++ "b/sp ace/t\\303\\251.py"
@@ -0,0 +1 @@
+x
"""


# ----- patches -----------------------------------------------------------------------------------------
def test_make_apply_reverse_roundtrip() -> None:
    diff = patches.make_patch(OLD, NEW)
    assert "\\ No newline at end of file" in diff and "deleted file mode" in diff and "new file mode" in diff
    assert patches.apply_patch(OLD, diff) == NEW
    assert patches.apply_patch(NEW, diff, reverse=True) == OLD
    assert patches.touched_paths(diff) == {"pkg/a.py", "pkg/b.py", "c.py", "gone.py"}
    assert patches.make_patch(OLD, OLD) == ""


def test_parse_git_generated_diff() -> None:
    fps = patches.parse_patch(GIT_DIFF)
    assert [(f.old_path, f.new_path) for f in fps] == [("b.py", None), ("c.py", "c.py"), (None, "sp ace/té.py")]
    assert fps[0].hunks[0].old_text == "no newline!"
    assert fps[1].hunks[0].new_text == "new\nq\n"
    assert patches.apply_patch({"b.py": "no newline!", "c.py": "new\n"}, GIT_DIFF) == {
        "c.py": "new\nq\n", "sp ace/té.py": "x\n"}


def test_apply_errors() -> None:
    diff = patches.make_patch({"a.py": "a\nb\n"}, {"a.py": "a\nc\n"})
    with pytest.raises(patches.PatchError, match="does not apply"):
        patches.apply_patch({"a.py": "other\n"}, diff)
    with pytest.raises(patches.PatchError, match="no such file"):
        patches.apply_patch({}, diff)
    with pytest.raises(patches.PatchError, match="truncated"):
        patches.parse_patch(diff.rsplit("\n", 2)[0] + "\n")


def test_patch_to_edits() -> None:
    old = {"m.py": "def f(a, b):\n    return a - b\n\n\ndef g():\n    return 1\n", "x.py": "x\n"}
    new = {"m.py": old["m.py"].replace("a - b", "a + b").replace("return 1", "return 2"), "n.py": "n\n"}
    edits = patches.patch_to_edits(patches.make_patch(old, new, context=1))
    assert [(e.path, e.delete) for e in edits] == [("m.py", False), ("m.py", False), ("n.py", False), ("x.py", True)]
    assert edits[0].old_str == "def f(a, b):\n    return a - b\n\n" and "a + b" in edits[0].new_str
    assert edits[2].old_str == "" and edits[2].new_str == "n\n"
    files = dict(old)
    for e in edits[:2]:
        files[e.path], _ = patches.replace_unique(files[e.path], e.old_str, e.new_str)
    assert files["m.py"] == new["m.py"]


def test_replace_unique() -> None:
    assert patches.replace_unique("a\nb\nc\n", "b\n", "B\n") == ("a\nB\nc\n", 2)
    with pytest.raises(LookupError):
        patches.replace_unique("abc", "x", "y")
    with pytest.raises(ValueError) as info:
        patches.replace_unique("x = 1\ny\nx = 1\n", "x = 1", "x = 2")
    assert info.value.args[0] == [1, 3]
    with pytest.raises(ValueError):
        patches.replace_unique("aaa", "aa", "b")  # overlapping matches are ambiguous too


# ----- what reaches grading ----------------------------------------------------------------------------
@pytest.mark.parametrize("path", [
    "conftest.py", "pkg/conftest.py", "tests/test_a.py", "test_x.py", "pkg/x_test.py", "pytest.ini", "tox.ini",
    "setup.cfg", "pyproject.toml", "sitecustomize.py", "evil.pth", "tests/helpers.py", "../outside.py",
    "/abs.py", ".git/config", "hidden/test/util.py", "owned.txt",
])  # fmt: skip
def test_protected_paths(path: str) -> None:
    assert protect.is_protected(path, owned=["owned.txt"])


@pytest.mark.parametrize("path", ["pkg/mod.py", "README.md", "pkg/testing_utils.py", "contest.py", "src/a/b.py"])
def test_unprotected_paths(path: str) -> None:
    assert not protect.is_protected(path)


def test_filter_patch_drops_test_changes_and_symlinks() -> None:
    diff = patches.make_patch(
        {"pkg/m.py": "a\n", "tests/test_m.py": "assert 0\n"},
        {"pkg/m.py": "b\n", "conftest.py": "import pytest\n", "tests/test_m.py": "assert 1\n"},
    )
    link = "diff --git a/l b/l\nnew file mode 120000\n--- /dev/null\n+++ b/l\n@@ -0,0 +1 @@\n+/etc/passwd\n"
    kept, dropped = protect.filter_patch(diff + link, owned=["tests/test_m.py"])
    assert patches.touched_paths(kept) == {"pkg/m.py"}
    assert dropped == ["conftest.py", "l", "tests/test_m.py"]
    assert patches.apply_patch({"pkg/m.py": "a\n"}, kept) == {"pkg/m.py": "b\n"}


# ----- tool text ---------------------------------------------------------------------------------------
def test_truncate_middle() -> None:
    assert text.truncate_middle("short", 10) == "short"
    out = text.truncate_middle("a" * 50 + "b" * 50, 20)
    assert out.startswith("a" * 10) and out.endswith("b" * 10) and "80 characters omitted" in out
    with pytest.raises(ValueError):
        text.truncate_middle("x", 0)


def test_view_range() -> None:
    content = "".join(f"line {i}\n" for i in range(1, 31))
    shown, first, last = text.view_range(content, 5, 7, max_lines=100)
    assert (first, last) == (5, 7) and shown.splitlines() == ["   5\tline 5", "   6\tline 6", "   7\tline 7"]
    assert text.view_range(content, 25, None, 100)[2] == 30
    assert text.view_range(content, 1, -1, 10)[2] == 10  # capped by max_lines
    for start, end, msg in [(31, None, "past the end of the file \\(30 lines\\)"), (0, 3, ">= 1"),
                            (9, 4, "before start_line")]:
        with pytest.raises(ValueError, match=msg):
            text.view_range(content, start, end, 100)
    with pytest.raises(ValueError, match="empty"):
        text.view_range("", 1, None, 10)


def test_exec_observation() -> None:
    assert text.exec_observation("ok\n", 0, False, 30, 100) == "ok\n[exit code 0]"
    assert text.exec_observation("", 2, False, 30, 100) == "[exit code 2]"
    assert "timed out after 5s" in text.exec_observation("partial", 124, True, 5, 100)
    assert "omitted" in text.exec_observation("x" * 1000, 0, False, 30, 100)


# ----- scoring -----------------------------------------------------------------------------------------
def test_phase_status_and_score() -> None:
    raw = {"t::pass": {"setup": "passed", "call": "passed", "teardown": "passed"},
           "t::fail": {"setup": "passed", "call": "failed", "teardown": "passed"},
           "t::err": {"setup": "failed"}, "t::skip": {"setup": "skipped"},
           "t::xfail": {"setup": "passed", "call": "skipped", "xfail": True, "teardown": "passed"},
           "t::teardown": {"setup": "passed", "call": "passed", "teardown": "failed"}}
    st = results.statuses(raw)
    assert st == {"t::pass": "passed", "t::fail": "failed", "t::err": "error", "t::skip": "skipped",
                  "t::xfail": "xfailed", "t::teardown": "error"}
    s = results.score(st, ["t::pass", "t::missing"], ["t::xfail", "t::skip"])
    assert not s.resolved and s.partial_credit == 0.5
    assert s.metrics() == {"partial_credit": 0.5, "fail_to_pass_frac": 0.5, "pass_to_pass_frac": 0.5}
    assert results.score(st, ["t::pass"], ["t::xfail"]).resolved
    assert results.files_of(["a.py::x[1]", "a.py::C::y", "b.py::z"]) == ["a.py", "b.py"]


def test_git_ids_match_git() -> None:
    # the same tree committed by `git commit` with gitobj.commit_env() has this id (checked with git 2.39)
    files = {"a.py": b"x\n", "pkg/__init__.py": b"", "pkg/m.py": b"y=1\n", "pkg-x.txt": b"z", "pkg.txt": b"q"}
    assert gitobj.commit_id(files) == "3713b9cd493a3f2ff58a4ae5ff3181a3f7329901"
    assert gitobj.blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"


# ----- task rows ---------------------------------------------------------------------------------------
def _row(**kw: object) -> dict:
    row = {"instance_id": "o__r-1", "repo": "o/r", "base_commit": "abc", "problem_statement": "it breaks",
           "patch": patches.make_patch({"a.py": "1\n"}, {"a.py": "2\n"}),
           "test_patch": patches.make_patch({}, {"tests/test_a.py": "def test_a(): pass\n"}),
           "FAIL_TO_PASS": '["tests/test_a.py::test_a"]', "PASS_TO_PASS": "[]"}
    row.update(kw)
    return row


def test_task_validation(tmp_path: Path) -> None:
    task = SweTask.model_validate(_row(version="1.0"))
    assert task.FAIL_TO_PASS == ["tests/test_a.py::test_a"] and task.test_paths == {"tests/test_a.py"}
    assert task.model_extra == {"version": "1.0"}
    with pytest.raises(ValueError):
        SweTask.model_validate(_row(FAIL_TO_PASS=[]))
    with pytest.raises(ValueError):
        SweTask.model_validate(_row(patch="@@ -1 +1 @@\n-a\n"))
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(_row()) + "\n\n" + json.dumps(_row(instance_id="o__r-2")) + "\n")
    assert [r["id"] for r in load_jsonl(path)] == ["o__r-1", "o__r-2"]
    path.write_text(json.dumps(_row()) + "\n" + json.dumps(_row(problem_statement="")) + "\n")
    with pytest.raises(ValueError, match=r"tasks.jsonl:2"):
        load_jsonl(path)


def test_bundled_tasks() -> None:
    tasks = SweEnv.tasks("all")
    assert len(tasks) >= 30
    assert len(SweEnv.tasks("train")) + len(SweEnv.tasks("test")) == len(tasks) and SweEnv.tasks("test")
    assert len({t["instance_id"] for t in tasks}) == len(tasks)
    assert len({t["repo"] for t in tasks}) >= 5
    kinds = Counter(k for t in tasks for k in t["bug_kinds"])
    assert set(kinds) == set(KINDS)
    difficulty = Counter(t["difficulty"] for t in tasks)
    assert difficulty["easy"] and difficulty["medium"] >= 3 and difficulty["hard"] >= 3
    assert all(len(t["bug_files"]) == 2 for t in tasks if t["difficulty"] == "hard")
    for t in tasks:
        spec = SweTask.model_validate(t)
        base = base_tree(spec)
        assert not any(p.startswith("tests/") for p in base) and spec.test_paths.isdisjoint(base)
        assert gitobj.commit_id({p: c.encode() for p, c in base.items()}) == spec.base_commit
        fixed = patches.apply_patch(base, spec.patch)
        assert all(fixed[p] == clean_tree(spec.repo)[p] for p in t["bug_files"])
        calls = SweEnv.reference_solution(t)
        assert calls[-1] == ("submit", {}) and all(n == "edit_file" for n, _ in calls[:-1])
        # the issue tells the symptom, never the fix: no changed line of the patch appears in it
        for line in spec.patch.splitlines():
            if line[:1] in "+-" and not line.startswith(("+++", "---")) and len(line.strip()) > 12:
                assert line[1:].strip() not in spec.problem_statement, (t["instance_id"], line)
        assert not any(f in spec.problem_statement for f in t["bug_files"])


def test_bundled_tasks_file_is_small() -> None:
    from agentrl.envs.swe.env import BUNDLED_TASKS

    assert BUNDLED_TASKS.stat().st_size < 400 * 1024


# ----- bug injection and issues ------------------------------------------------------------------------
SOURCE = '''def clamp(x, lo=0, hi=10, strict=False):
    """Clamp."""
    if x is None:
        return lo
    total = x + 1
    if lo < x and x <= hi:
        return max(lo, min(x, hi))
    values = sorted([lo, hi], reverse=strict)
    return values[0] - 1
'''


def test_find_mutations() -> None:
    muts = find_mutations("m.py", SOURCE)
    kinds = Counter(m.kind for m in muts)
    assert set(kinds) == set(KINDS)
    for m in muts:
        ast.parse(m.apply(SOURCE))  # every mutant is valid Python
        assert m.apply(SOURCE) != SOURCE
    notes = {m.note for m in muts}
    assert {"`<` -> `<=`", "`and` -> `or`", "max() -> min()", "dropped `+ 1`", "default False -> True",
            "removed guard `if x is None:`", "arguments of max() swapped", "reverse flipped"} <= notes
    assert find_mutations("m.py", SOURCE) == muts  # deterministic


TEST_MODULE = '''import pytest

from pkg import Box, parse

DATA = "a,b"


def _box():
    return Box(DATA)


def test_box():
    """Boxes count their items."""
    b = _box()
    assert b.count() == 2 and b.first() == "a"


def test_parse_error():
    """Empty input is rejected."""
    with pytest.raises(ValueError):
        parse("")
'''


def test_repro_and_issue() -> None:
    repro = issues.make_repro(TEST_MODULE, "test_box")
    assert repro.doc == "Boxes count their items."
    assert repro.preamble == ["from pkg import Box", 'DATA = "a,b"', "def _box():\n    return Box(DATA)"]
    assert [s if isinstance(s, str) else (s.kind, s.code, s.expected) for s in repro.steps] == [
        "b = _box()", ("eq", "b.count()", "2"), ("eq", "b.first()", '"a"')]
    script = issues.probe_script(repro)
    compile(script, "probe", "exec")
    records = [{"i": 1, "got": {"ok": True, "repr": "2"}, "expected": {"ok": True, "repr": "2"}, "pass": True},
               {"i": 2, "got": {"ok": True, "repr": "'b'"}, "expected": {"ok": True, "repr": "'a'"}, "pass": False}]
    s = issues.symptom(repro, records)
    assert s.function == "first" and s.code.endswith("b = _box()\nb.count()\nb.first()")
    issue = issues.write_issue([s], "pkg", random.Random(0))
    assert "`'b'`, but I expected `'a'`" in issue and "boxes count their items" in issue
    raises = issues.make_repro(TEST_MODULE, "test_parse_error")
    assert raises.steps[0].kind == "raises" and raises.steps[0].expected == "ValueError"
    s = issues.symptom(raises, [{"i": 0, "got": {"ok": True, "repr": "None"}, "raised": None}])
    assert s.observed == "it runs without an error" and s.expected == "a `ValueError`"
    with pytest.raises(ValueError):
        issues.symptom(repro, [{**r, "pass": True} for r in records])
