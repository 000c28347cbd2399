"""Issue reports for the bundled tasks, written from a failing hidden test like a user would write them.

The failing test's body becomes a reproduction script: setup statements are kept, and each assertion is
turned into the expression it checks. The script runs against the buggy tree (`probe_script`), and the
report shows what the expression gives and what was expected (plus the test's docstring as the expected
behaviour). It describes the symptom only: nothing in it names the file or the line of the bug.
"""

from __future__ import annotations

import ast
import json
import random
import textwrap
from dataclasses import dataclass, field

from agentrl.core.errors import EnvError


class ProbeError(EnvError, ValueError):
    """An issue probe shows no symptom to report: it printed no result, or none of its checks fails on the
    buggy tree."""

    code = "env.swe.probe"


@dataclass
class Check:
    """One assertion of a test, as something a user would run and look at."""

    kind: str
    """``eq`` (``left == right``), ``truthy``, ``is_none``, ``not_none`` or ``raises``."""
    code: str
    """What the user runs (an expression, or statements for ``raises``)."""
    expected: str = ""
    """Source of the expected value (``eq``) or exception name (``raises``)."""


@dataclass
class Repro:
    """A test turned into a reproduction: statements in order, each either setup code or a check."""

    preamble: list[str]
    """Imports and helpers the steps need."""
    steps: list[str | Check] = field(default_factory=list)
    doc: str = ""


_PROBE_HEAD = '''import json as __json

import pytest


def __run(fn):
    try:
        return {"ok": True, "value": fn()}
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}".strip().rstrip(":")}


def __show(r):
    if not r["ok"]:
        return r
    v = r["value"]
    return {"ok": True, "repr": repr(v)}


__out = []
'''


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _calls(node: ast.AST) -> list[str]:
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            if isinstance(n.func, ast.Name):
                out.append(n.func.id)
            elif isinstance(n.func, ast.Attribute):
                out.append(n.func.attr)
    return out


def _split_assert(test: ast.expr, seg) -> list[Check]:  # type: ignore[no-untyped-def]
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [c for v in test.values for c in _split_assert(v, seg)]
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        op, right = test.ops[0], test.comparators[0]
        if isinstance(op, ast.Eq):
            return [Check("eq", seg(test.left), seg(right))]
        if isinstance(op, ast.Is) and isinstance(right, ast.Constant) and right.value is None:
            return [Check("is_none", seg(test.left))]
        if isinstance(op, ast.IsNot) and isinstance(right, ast.Constant) and right.value is None:
            return [Check("not_none", seg(test.left))]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return [Check("eq", seg(test.operand), "False")]
    return [Check("truthy", seg(test))]


def make_repro(test_source: str, test_name: str) -> Repro:
    """The reproduction of test ``test_name`` in the test module ``test_source``."""
    tree = ast.parse(test_source)

    def seg(node: ast.AST) -> str:
        return textwrap.dedent(ast.get_source_segment(test_source, node) or "")

    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == test_name)
    body = list(fn.body)
    doc = ""
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        doc = str(body[0].value.value).strip()
        body = body[1:]
    steps: list[str | Check] = []
    for stmt in body:
        if isinstance(stmt, ast.Assert):
            steps.extend(_split_assert(stmt.test, seg))
        elif (isinstance(stmt, ast.With) and len(stmt.items) == 1 and isinstance(stmt.items[0].context_expr, ast.Call)
              and _calls(stmt.items[0].context_expr)[:1] == ["raises"]):
            exc = stmt.items[0].context_expr.args[0]
            code = "\n".join(seg(s) for s in stmt.body if not isinstance(s, ast.Assert))
            steps.append(Check("raises", code, seg(exc)))
        else:
            steps.append(seg(stmt))
    used = set().union(*(_names(ast.parse(s if isinstance(s, str) else s.code)) for s in steps)) if steps else set()
    helpers: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node is not fn and not node.name.startswith("test_"):
            helpers[node.name] = node
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            helpers[node.targets[0].id] = node
    chosen: set[str] = set()
    while True:  # helpers the steps use, and the helpers those use
        new = {n for n in used & set(helpers) if n not in chosen}
        if not new:
            break
        chosen |= new
        for n in new:
            used |= _names(helpers[n])
    preamble: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            keep = [a for a in node.names if (a.asname or a.name.split(".")[0]) in used and a.name != "pytest"]
            if not keep:
                continue
            names = ", ".join(a.name if a.asname is None else f"{a.name} as {a.asname}" for a in keep)
            preamble.append(f"from {node.module} import {names}" if isinstance(node, ast.ImportFrom)
                            else f"import {names}")
    preamble += [seg(node) for name, node in helpers.items() if name in chosen]
    return Repro(preamble=preamble, steps=steps, doc=doc)


def probe_script(repro: Repro) -> str:
    """A script that runs the repro and prints, as JSON, what each check gave (runs every step)."""
    lines = [_PROBE_HEAD, *repro.preamble, ""]
    for i, step in enumerate(repro.steps):
        if isinstance(step, str):
            lines.append(step)
            continue
        if step.kind == "raises":
            lines.append(f"def __block{i}():")
            lines.append(textwrap.indent(step.code or "pass", "    "))
            lines.append(f"    return None\n__r = __run(__block{i})")
            lines.append(f"__out.append({{'i': {i}, 'got': __show(__r), 'raised': None if __r['ok'] else "
                         f"__r['error'].split(':')[0]}})")
            continue
        lines.append(f"__r = __run(lambda: ({step.code}))")
        if step.kind == "eq":
            lines.append(f"__e = __run(lambda: ({step.expected}))")
            lines.append(f"__out.append({{'i': {i}, 'got': __show(__r), 'expected': __show(__e), "
                         f"'pass': __r['ok'] and __e['ok'] and __r['value'] == __e['value']}})")
        elif step.kind == "truthy":
            lines.append(f"__out.append({{'i': {i}, 'got': __show(__r), 'pass': __r['ok'] and bool(__r['value'])}})")
        elif step.kind == "is_none":
            lines.append(f"__out.append({{'i': {i}, 'got': __show(__r), 'pass': __r['ok'] and __r['value'] is None}})")
        else:
            lines.append(f"__out.append({{'i': {i}, 'got': __show(__r), "
                         f"'pass': __r['ok'] and __r['value'] is not None}})")
    lines.append("print('AGENTRL_PROBE ' + __json.dumps(__out))")
    return "\n".join(lines) + "\n"


def parse_probe(stdout: str) -> list[dict]:
    """The probe's JSON records."""
    for line in stdout.splitlines():
        if line.startswith("AGENTRL_PROBE "):
            return json.loads(line[len("AGENTRL_PROBE ") :])
    raise ProbeError(f"the probe printed no result: {stdout[-500:]}")


@dataclass
class Symptom:
    """The first check of a test that misbehaves on the buggy tree, ready to be written up."""

    code: str
    """The reproduction, ending with the misbehaving expression or statements."""
    observed: str
    expected: str
    function: str
    """The function the user calls in the misbehaving step (for the title)."""
    doc: str


def _fence(code: str) -> str:
    return f"```python\n{code.strip()}\n```"


def symptom(repro: Repro, records: list[dict]) -> Symptom:
    """The first failing check, with the setup that leads to it (raises ProbeError, a ValueError, if none
    fails)."""
    by_index = {r["i"]: r for r in records}
    code: list[str] = []
    for i, step in enumerate(repro.steps):
        if isinstance(step, str):
            code.append(step)
            continue
        rec = by_index.get(i)
        if rec is None:
            break
        got = rec["got"]
        shown = f"`{got['repr']}`" if got["ok"] else f"an error: `{got['error']}`"
        if step.kind == "raises":
            failed = rec["raised"] != step.expected.split(".")[-1]
            observed = ("it runs without an error" if rec["raised"] is None and got["ok"]
                        else f"it raises `{got['error']}`")
            expected = f"a `{step.expected.split('.')[-1]}`"
        else:
            failed = not rec["pass"]
            observed = shown
            if step.kind == "eq":
                exp = rec["expected"]
                expected = f"`{exp['repr']}`" if exp["ok"] else f"`{step.expected}`"
            else:
                expected = {"truthy": "a true value", "is_none": "`None`", "not_none": "a result (not `None`)"}[
                    step.kind]
        if failed:
            calls = _calls(ast.parse(step.code))
            func = next((c for c in calls if not c.startswith("_")), calls[0] if calls else "the code")
            return Symptom("\n".join([*repro.preamble, "", *code, step.code]).strip(), observed, expected, func,
                           repro.doc)
        if step.kind != "raises":  # keep the effect of passing checks that mutate state
            code.append(step.code)
    raise ProbeError("no check of this test fails on the buggy tree")


_TITLES = [
    "`{f}` gives a wrong result",
    "Unexpected result from `{f}`",
    "Bug in `{f}`",
    "`{f}` misbehaves",
    "Wrong output from `{f}`",
]
_INTROS = [
    "I ran into this while using `{pkg}`:",
    "Here is a small reproduction:",
    "Steps to reproduce:",
    "Minimal example:",
    "This snippet shows the problem:",
]


def _section(s: Symptom) -> str:
    text = f"{_fence(s.code)}\n\nThe last line gives {s.observed}, but I expected {s.expected}."
    if s.doc:
        text += f" Expected behaviour: {s.doc[0].lower() + s.doc[1:]}"
    return text


def write_issue(symptoms: list[Symptom], package: str, rng: random.Random) -> str:
    """An issue report for one symptom or several (several bugs at once)."""
    first = symptoms[0]
    title = rng.choice(_TITLES).format(f=first.function)
    if first.observed.startswith(("an error", "it raises")):
        title = f"`{first.function}` fails with an error"
    if len(symptoms) == 1:
        return f"{title}\n\n{rng.choice(_INTROS).format(pkg=package)}\n\n{_section(first)}\n"
    funcs = sorted({s.function for s in symptoms})
    title = f"Several wrong results ({', '.join(f'`{f}`' for f in funcs)})"
    parts = [f"{title}\n\nI found {len(symptoms)} problems in `{package}`, possibly related."]
    for n, s in enumerate(symptoms, 1):
        parts.append(f"{n}. {_section(s)}")
    return "\n\n".join(parts) + "\n"
