"""Mutation check of ``objectives/``: change one operator or constant at a time, run the objective
tests, and list the mutants no test kills.

    python scripts/mutate_objectives.py [--files objectives/sdar.py ...] [--out mutants.json]
    python scripts/mutate_objectives.py --again mutants.json     # only the survivors of an earlier run

Each mutant is one of: an arithmetic operator swapped (+ -, * /), a comparison flipped (< <=, > >=),
a numeric constant changed (c -> c + 1, 0 -> 1), a unary minus dropped, a ``.detach()`` removed,
``min``/``max`` (and ``torch.minimum``/``torch.maximum``, ``clamp``'s ``min=``/``max=``) swapped, or
an ``exp``/``log`` swapped. Only code inside functions is mutated (docstrings, field descriptions
and imports are left alone). The file is restored after every mutant, also on Ctrl-C.

Speed: the parent imports torch and pytest once and forks a child per mutant; the child imports
``agentkit`` afresh (with a private bytecode cache, so no stale .pyc of an earlier mutant is read)
and runs the tests in process.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ["tests/test_objective_golden.py", "tests/test_objectives.py", "tests/test_distill_objectives.py"]
FILES = ["common.py", "batch.py", "grpo.py", "sdar.py", "opsd.py", "grpo_opsd.py", "rlsd.py", "skill_sd.py",
         "opd.py", "sage_opd.py", "sft.py"]
SWAP_BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult}
SWAP_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
SWAP_NAME = {"minimum": "maximum", "maximum": "minimum", "min": "max", "max": "min", "exp": "log", "log": "exp"}


def _in_function(tree: ast.AST) -> set[int]:
    """ids of nodes inside function bodies, docstrings and ``float(x.detach())`` (a logged
    metric's value: no loss depends on it) excluded."""
    inside: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef):
            body = fn.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]
            for stmt in body:
                inside.update(id(n) for n in ast.walk(stmt))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float":
            inside.difference_update(id(a) for a in node.args if _kind(a) == "detach")
    return inside


def mutants(source: str):
    """(description, mutated source) for every mutation point of ``source``."""
    tree = ast.parse(source)
    inside = _in_function(tree)
    points = []
    for node in ast.walk(tree):
        if id(node) not in inside:
            continue
        if isinstance(node, ast.BinOp) and type(node.op) in SWAP_BIN:
            points.append((node, "op", type(node.op).__name__))
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in SWAP_CMP:
            points.append((node, "cmp", type(node.ops[0]).__name__))
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float) and not isinstance(node.value, bool):
            points.append((node, "const", repr(node.value)))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            points.append((node, "neg", ""))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "detach":
            points.append((node, "detach", ""))
        elif isinstance(node, ast.Attribute) and node.attr in SWAP_NAME:
            points.append((node, "name", node.attr))
        elif isinstance(node, ast.Name) and node.id in ("min", "max"):
            points.append((node, "name", node.id))
        elif isinstance(node, ast.keyword) and node.arg in ("min", "max"):
            points.append((node, "kw", node.arg))
    for index in range(len(points)):
        tree = ast.parse(source)
        inside = _in_function(tree)
        # the same walk order finds the same point in the fresh tree
        fresh = [n for n in ast.walk(tree) if id(n) in inside and _kind(n)]
        node = fresh[index]
        kind = _kind(node)
        line = node.lineno
        if kind == "op":
            old = type(node.op).__name__
            node.op = SWAP_BIN[type(node.op)]()
            what = f"{old} -> {type(node.op).__name__}"
        elif kind == "cmp":
            old = type(node.ops[0]).__name__
            node.ops = [SWAP_CMP[type(node.ops[0])]()]
            what = f"{old} -> {type(node.ops[0]).__name__}"
        elif kind == "const":
            old = node.value
            node.value = 1 if old == 0 else old + 1
            what = f"{old!r} -> {node.value!r}"
        elif kind == "neg":
            what = "drop unary minus"
            _replace(tree, node, node.operand)
        elif kind == "detach":
            what = "drop .detach()"
            _replace(tree, node, node.func.value)
        elif kind == "name":
            old = node.attr if isinstance(node, ast.Attribute) else node.id
            if isinstance(node, ast.Attribute):
                node.attr = SWAP_NAME[old]
            else:
                node.id = SWAP_NAME[old]
            what = f"{old} -> {SWAP_NAME[old]}"
        else:  # kw
            old = node.arg
            node.arg = "max" if old == "min" else "min"
            what = f"clamp {old}= -> {node.arg}="
        yield f"line {line}: {what}", ast.unparse(tree), line


def _kind(node: ast.AST) -> str | None:
    if isinstance(node, ast.BinOp) and type(node.op) in SWAP_BIN:
        return "op"
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in SWAP_CMP:
        return "cmp"
    if isinstance(node, ast.Constant) and type(node.value) in (int, float) and not isinstance(node.value, bool):
        return "const"
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return "neg"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "detach":
        return "detach"
    if isinstance(node, ast.Attribute) and node.attr in SWAP_NAME:
        return "name"
    if isinstance(node, ast.Name) and node.id in ("min", "max"):
        return "name"
    if isinstance(node, ast.keyword) and node.arg in ("min", "max"):
        return "kw"
    return None


def _replace(tree: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, field, new)
                return
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if item is old:
                        value[i] = new
                        return


def _run_tests() -> int:
    """The objective tests' pytest exit code, in a forked child that imports agentkit afresh."""
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            sys.pycache_prefix = tempfile.mkdtemp(prefix="mutant-pyc-")
            sys.dont_write_bytecode = True
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            import pytest

            code = int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", "-m", "not slow", "-k", "not ratio_is_one",
                                    *[str(ROOT / t) for t in TESTS]]))
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", nargs="*", default=[f"objectives/{f}" for f in FILES])
    parser.add_argument("--out", default="mutants.json", help="Where the survivors are written (JSON).")
    parser.add_argument("--again", help="Run only the survivors listed in this earlier --out file.")
    args = parser.parse_args(argv)
    again = None
    if args.again:
        earlier = json.loads(Path(args.again).read_text())["survivors"]
        again = {(r["file"], r["mutant"]) for r in earlier}
        args.files = sorted({r["file"] for r in earlier})
    import pydantic  # noqa: F401  (imported once here; every child inherits them)
    import pytest  # noqa: F401
    import torch  # noqa: F401

    os.chdir(ROOT)
    assert not any(name.startswith("agentkit") for name in sys.modules), "agentkit must be imported in the children"
    results = []
    for name in args.files:
        path = ROOT / name
        original = path.read_text(encoding="utf-8")
        try:
            for what, source, line in mutants(original):
                if again is not None and (name, what) not in again:
                    continue
                path.write_text(source, encoding="utf-8")
                started = time.perf_counter()
                returncode = _run_tests()
                killed = returncode != 0
                code = original.splitlines()[line - 1].strip()
                results.append({"file": name, "mutant": what, "code": code, "killed": killed,
                                "seconds": round(time.perf_counter() - started, 1)})
                print(f"{'killed  ' if killed else 'SURVIVED'} {name} {what}: {code}", flush=True)
        finally:
            path.write_text(original, encoding="utf-8")
    survivors = [r for r in results if not r["killed"]]
    Path(args.out).write_text(json.dumps({"mutants": len(results), "survivors": survivors}, indent=1))
    print(f"{len(results)} mutants, {len(results) - len(survivors)} killed, {len(survivors)} survived -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
