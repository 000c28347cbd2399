"""Build the bundled SWE tasks: ``python -m agentrl.envs.swe.build_tasks [--seed 0] [--out FILE] [--check]``.

For each bundled repository (``envs/swe/repos/<name>``, clean sources with their own tests):

1. list candidate bug injections in its source files (`mutations.find_mutations`), shuffled by the seed
   and interleaved by kind;
2. run the repository's tests on each candidate (in order, in small batches) and keep those that make
   1 to ``max_failing`` tests fail while everything still collects; at most ``max_per_kind`` per kind;
3. make single-bug tasks from the first ones, and multi-file tasks from pairs of the rest (two bugs in
   two files, both symptoms reported);
4. write each task: ``patch`` (buggy -> clean), ``test_patch`` (adds the test files of the failing tests),
   FAIL_TO_PASS (the failing tests), PASS_TO_PASS (the other tests of those files), ``base_commit`` (the
   id of the agent's single commit), and an issue written from one failing test per bug (`issues`);
5. validate every task: on the base tree plus the test patch, FAIL_TO_PASS fail and PASS_TO_PASS pass;
   with ``patch`` applied as well, all pass; the reference edits apply one by one, each matching once.

Everything depends only on the sources and the seed: rebuilding gives a byte-identical file.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentrl.core.errors import EnvError
from agentrl.envs.swe import issues, localrun
from agentrl.envs.swe.gitobj import commit_id
from agentrl.envs.swe.mutations import Mutation, find_mutations
from agentrl.envs.swe.patches import (
    PatchError,
    TextNotFound,
    TextNotUnique,
    apply_patch,
    make_patch,
    patch_to_edits,
    replace_unique,
)
from agentrl.envs.swe.repo import REPOS_DIR, as_bytes, read_tree, strip_hidden
from agentrl.envs.swe.results import PASSING, files_of

DEFAULT_OUT = Path(__file__).resolve().parent / "data" / "tasks.jsonl"
REPOS = ("durations", "exprcalc", "inventory", "minigraph", "textkit", "tinycsv")


@dataclass(frozen=True)
class BuildConfig:
    """How many tasks of which shape the builder makes."""

    seed: int = 0
    """Seeds candidate order, issue wording and test choice."""
    singles_per_repo: int = 6
    """Single-bug tasks per repository."""
    pairs_per_repo: int = 1
    """Two-bug, two-file tasks per repository."""
    max_failing: int = 5
    """A candidate bug may break at most this many tests (targeted bugs, not broken modules)."""
    max_per_kind: int = 2
    """At most this many accepted bugs of one kind per repository."""
    max_per_file: int = 4
    """At most this many accepted bugs in one source file per repository."""
    max_tries: int = 72
    """Candidates tested per repository at most."""
    spare: int = 2
    """Extra accepted bugs per repository, so that two-file pairs can be found."""
    test_every: int = 4
    """About one task in ``test_every`` goes to the test split (by a hash of its id)."""
    workers: int = 2
    """Test runs in parallel."""
    batch: int = 6
    """Candidates tested per round (order-independent results)."""


# ----- running tests on a tree ------------------------------------------------------------------------
_RUNS: dict[str, dict[str, str] | None] = {}


def run_tests(files: dict[str, str]) -> dict[str, str] | None:
    """Status of every test of ``files`` (a whole repository tree), or None when the run hangs/crashes.
    Results are remembered per tree for the rest of the build."""
    key = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    if key not in _RUNS:
        _RUNS[key] = localrun.run_tests(files)
    return _RUNS[key]


def run_probe(files: dict[str, str], script: str) -> list[dict[str, Any]]:
    """Run an issue probe script against ``files``."""
    return issues.parse_probe(localrun.run_script(files, script))


def failing(status: dict[str, str]) -> set[str]:
    return {t for t, s in status.items() if s not in PASSING}


# ----- choosing bugs -----------------------------------------------------------------------------------
def _round_robin(groups: dict[str, list[Mutation]], rng: random.Random) -> list[Mutation]:
    keys = sorted(groups)
    rng.shuffle(keys)
    out: list[Mutation] = []
    while any(groups.values()):
        for k in keys:
            if groups[k]:
                out.append(groups[k].pop(0))
    return out


def _interleave(cands: list[Mutation], rng: random.Random) -> list[Mutation]:
    """Candidates in a seeded order that alternates bug kinds, and within a kind alternates files."""
    by_kind: dict[str, list[Mutation]] = {}
    for m in cands:
        by_kind.setdefault(m.kind, []).append(m)
    for kind, ms in by_kind.items():
        by_file: dict[str, list[Mutation]] = {}
        for m in ms:
            by_file.setdefault(m.path, []).append(m)
        for group in by_file.values():
            rng.shuffle(group)
        by_kind[kind] = _round_robin(by_file, rng)
    return _round_robin(by_kind, rng)


@dataclass
class Accepted:
    mutation: Mutation
    failing: set[str]


def choose_bugs(repo: str, clean: dict[str, str], clean_status: dict[str, str], cfg: BuildConfig,
                pool: concurrent.futures.Executor, log: Any) -> list[Accepted]:
    rng = random.Random(f"{cfg.seed}:{repo}:bugs")
    sources = sorted(p for p in clean if p.endswith(".py") and not p.startswith("tests/")
                     and not p.endswith("__init__.py"))
    cands = _interleave([m for p in sources for m in find_mutations(p, clean[p])], rng)
    need = cfg.singles_per_repo + 2 * cfg.pairs_per_repo + cfg.spare
    accepted: list[Accepted] = []
    per_kind: Counter[str] = Counter()
    per_file: Counter[str] = Counter()
    used_lines: set[tuple[str, int]] = set()
    tried = 0
    for i in range(0, min(len(cands), cfg.max_tries), cfg.batch):
        batch = cands[i : i + cfg.batch]
        tried += len(batch)
        trees = []
        for m in batch:
            tree = dict(clean)
            tree[m.path] = m.apply(clean[m.path])
            trees.append(tree)
        for m, status in zip(batch, pool.map(run_tests, trees), strict=True):
            if status is None or set(status) != set(clean_status):
                continue
            bad = failing(status)
            if not 1 <= len(bad) <= cfg.max_failing or per_kind[m.kind] >= cfg.max_per_kind:
                continue
            if per_file[m.path] >= cfg.max_per_file:
                continue
            if (m.path, m.line) in used_lines:
                continue
            accepted.append(Accepted(m, bad))
            per_kind[m.kind] += 1
            per_file[m.path] += 1
            used_lines.add((m.path, m.line))
        if len(accepted) >= need:
            break
    log(f"{repo}: tried {tried} of {len(cands)} candidates, accepted {len(accepted)}")
    return accepted[:need]


def _pairs(rest: list[Accepted], n: int) -> list[tuple[Accepted, Accepted]]:
    out: list[tuple[Accepted, Accepted]] = []
    free = list(rest)
    while free and len(out) < n:
        a = free.pop(0)
        for b in free:
            if b.mutation.path != a.mutation.path and not (a.failing & b.failing):
                free.remove(b)
                out.append((a, b))
                break
    return out


# ----- writing tasks -----------------------------------------------------------------------------------
def _defining_files(clean: dict[str, str], func: str) -> set[str]:
    return {p for p, c in clean.items() if not p.startswith("tests/") and (f"def {func}(" in c or f"class {func}" in c)}


def _oracle_ok(base: dict[str, str], patch: str, clean_parts: dict[str, str]) -> bool:
    files = dict(base)
    try:
        for e in patch_to_edits(patch):
            files[e.path], _ = replace_unique(files[e.path], e.old_str, e.new_str)
    except (PatchError, TextNotFound, TextNotUnique, KeyError):  # KeyError: an edit of a file the tree lacks
        return False
    return all(files[p] == c for p, c in clean_parts.items())


class TaskBuildError(EnvError, RuntimeError):
    """The bundled tasks cannot be built: a repository's tests fail or hang, or a bug has no usable reference
    patch."""

    code = "env.swe.task_build"


class NoSymptom(TaskBuildError):
    """No failing test of a bug shows a symptom a user could report (the bug is skipped)."""

    code = "env.swe.no_symptom"


def make_task(repo: str, bugs: list[Accepted], clean: dict[str, str], cfg: BuildConfig) -> dict[str, Any]:
    """A task row (without ``instance_id`` and ``split``) for ``bugs`` injected together."""
    rng = random.Random(f"{cfg.seed}:{repo}:" + ";".join(f"{b.mutation.path}:{b.mutation.start}" for b in bugs))
    label = "+".join(f"{b.mutation.path}:{b.mutation.line}" for b in bugs)
    buggy = dict(clean)
    for b in bugs:
        buggy[b.mutation.path] = b.mutation.apply(buggy[b.mutation.path])
    status = run_tests(buggy)
    if status is None:
        raise TaskBuildError(f"{repo} {label}: the buggy tree's tests hang")
    f2p = sorted(failing(status))
    test_files = files_of(f2p)
    p2p = sorted(t for t in status if t.split("::")[0] in test_files and t not in f2p)
    test_patch = make_patch({}, {f: clean[f] for f in test_files})
    paths = sorted({b.mutation.path for b in bugs})
    base = strip_hidden(buggy, set(test_files))
    for context in (3, 5, 8, 12, 20):
        patch = make_patch({p: buggy[p] for p in paths}, {p: clean[p] for p in paths}, context=context)
        if _oracle_ok(base, patch, {p: clean[p] for p in paths}):
            break
    else:
        raise TaskBuildError(f"{repo} {label}: no reference patch whose hunks are unique")
    symptoms = []
    for b in bugs:
        candidates = sorted(b.failing & set(f2p))
        rng.shuffle(candidates)
        for test_id in candidates:
            path, name = test_id.split("::", 1)
            repro = issues.make_repro(clean[path], name)
            try:
                symptoms.append(issues.symptom(repro, run_probe(buggy, issues.probe_script(repro))))
                break
            except issues.ProbeError:
                continue
        else:
            raise NoSymptom(f"{repo} {label}: no failing test gives a reproducible symptom")
    statement = issues.write_issue(symptoms, repo, rng)
    if len(bugs) > 1:
        difficulty = "hard"
    else:
        difficulty = "easy" if paths[0] in _defining_files(clean, symptoms[0].function) else "medium"
    return {
        "instance_id": "",
        "repo": f"agentrl/{repo}",
        "base_commit": commit_id(as_bytes(base)),
        "problem_statement": statement,
        "patch": patch,
        "test_patch": test_patch,
        "FAIL_TO_PASS": f2p,
        "PASS_TO_PASS": p2p,
        "split": "",
        "difficulty": difficulty,
        "bug_kinds": [b.mutation.kind for b in bugs],
        "bug_files": paths,
    }


def _try_task(repo: str, bugs: list[Accepted], clean: dict[str, str], cfg: BuildConfig) -> dict[str, Any] | None:
    try:
        return make_task(repo, bugs, clean, cfg)
    except NoSymptom:
        return None


def validate(task: dict[str, Any]) -> None:
    """Raise AssertionError unless the hidden tests fail on the base tree and pass with the patch."""
    from agentrl.envs.swe.repo import base_tree
    from agentrl.envs.swe.task import SweTask

    spec = SweTask.model_validate(task)
    base = base_tree(spec)
    assert commit_id(as_bytes(base)) == spec.base_commit, "base commit mismatch"
    assert not any(p.startswith("tests/") for p in base), "hidden tests visible"
    before = run_tests(apply_patch(base, spec.test_patch))
    after = run_tests(apply_patch(apply_patch(base, spec.patch), spec.test_patch))
    assert before is not None and after is not None, "test run hangs"
    assert all(before.get(t) not in PASSING for t in spec.FAIL_TO_PASS), "a FAIL_TO_PASS test passes before the fix"
    assert all(before.get(t) in PASSING for t in spec.PASS_TO_PASS), "a PASS_TO_PASS test fails before the fix"
    assert all(after.get(t) in PASSING for t in spec.test_ids), "a listed test fails after the fix"
    clean_parts = {p: c for p, c in apply_patch(base, spec.patch).items() if p in spec.model_extra["bug_files"]}
    assert _oracle_ok(base, spec.patch, clean_parts), "the reference edits do not apply one by one"


DIGEST_OUT = DEFAULT_OUT.with_name("tasks.inputs.sha256")
"""The digest of what the bundled tasks were built from (:func:`inputs_digest`), written beside them."""


def inputs_digest(cfg: BuildConfig | None = None) -> str:
    """A digest of everything the tasks are built from: the bundled repositories' files, this package's
    sources and the build config. The same digest means a rebuild would give the same tasks (the builder is
    deterministic: every repository's choices are seeded by the config's seed and the repository's name)."""
    h = hashlib.sha256(json.dumps(asdict(cfg or BuildConfig()), sort_keys=True).encode())
    for f in sorted(Path(__file__).resolve().parent.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    for repo in REPOS:  # the files the build reads (caches skipped)
        for path, text in read_tree(REPOS_DIR / repo).items():
            h.update(f"{repo}/{path}".encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()


def build(cfg: BuildConfig, log: Any = print, repos: tuple[str, ...] = REPOS) -> list[dict[str, Any]]:
    """The bundled tasks of ``repos`` (validated), sorted by instance id; each repository's tasks do not
    depend on which others are built."""
    tasks: list[dict[str, Any]] = []
    with concurrent.futures.ThreadPoolExecutor(cfg.workers) as pool:
        for repo in repos:
            clean = read_tree(REPOS_DIR / repo)
            clean_status = run_tests(clean)
            if clean_status is None or failing(clean_status) or not clean_status:
                raise TaskBuildError(f"{repo}: the clean repository's tests do not all pass")
            bugs = choose_bugs(repo, clean, clean_status, cfg, pool, log)
            rows = list(pool.map(lambda b: _try_task(repo, [b], clean, cfg), bugs))  # noqa: B023
            singles = [i for i, row in enumerate(rows) if row is not None][: cfg.singles_per_repo]
            made = [rows[i] for i in singles]
            rest = [b for i, b in enumerate(bugs) if i not in singles]
            for pair in _pairs(rest, cfg.pairs_per_repo):
                row = _try_task(repo, list(pair), clean, cfg)
                if row is not None:
                    made.append(row)
            for number, row in enumerate(made, 1):
                row["instance_id"] = f"agentrl__{repo}-{number}"
                test = int(hashlib.sha256(row["instance_id"].encode()).hexdigest(), 16) % cfg.test_every == 0
                row["split"] = "test" if test else "train"
            list(pool.map(validate, made))
            tasks.extend(made)
    return sorted(tasks, key=lambda t: t["instance_id"])


def dumps(tasks: list[dict[str, Any]]) -> str:
    """The JSONL text of ``tasks`` (stable key order)."""
    return "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in tasks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl.envs.swe.build_tasks", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true", help="rebuild and compare with --out; exit 1 if different")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    tasks = build(BuildConfig(seed=args.seed), log=(lambda *_: None) if args.quiet else print)
    text = dumps(tasks)
    kinds = Counter(k for t in tasks for k in t["bug_kinds"])
    summary = (f"{len(tasks)} tasks ({dict(Counter(t['split'] for t in tasks))}, "
               f"{dict(Counter(t['difficulty'] for t in tasks))}), kinds {dict(sorted(kinds.items()))}, "
               f"{len(text) / 1024:.0f} KiB, {time.perf_counter() - t0:.0f}s")
    digest_out = args.out.with_name(DIGEST_OUT.name)
    if args.check:
        same = args.out.is_file() and args.out.read_text() == text
        print(f"{'identical' if same else 'DIFFERENT'}: {summary}")
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    digest_out.write_text(inputs_digest(BuildConfig(seed=args.seed)) + "\n")
    print(f"wrote {args.out}: {summary}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
