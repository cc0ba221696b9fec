#!/usr/bin/env python3
"""The shape of vkit's code, for the redesign's before/after table: library→cli import edges,
modules over 600 lines, functions over 100 lines, classes over 25 methods or 400 code lines (and
the largest classes), the largest CLI module and the repeated code that `duplicates` (the
workplace tool, when on PATH) finds outside boilerplate. tests/test_layering.py holds vkit to the
same limits (it imports ``class_shapes`` from here).

    python3 bench/code_shape.py [REPO] [-o bench/results/code_shape.json]

REPO defaults to this checkout; give another checkout (e.g. `git worktree add /tmp/old REV`) to
measure an older revision the same way. Reads files only; runs nothing of vkit.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys

MODULE_LINES, FUNCTION_LINES = 600, 100
CLASS_METHODS, CLASS_CODE_LINES = 25, 400


def modules(root: str) -> list[str]:
    out = []
    for d, _, files in os.walk(os.path.join(root, "vkit")):
        out += [os.path.join(d, f) for f in files if f.endswith(".py")]
    return sorted(out)


def module_lines(text: str) -> int:
    """A module's lines, the last one counted whether or not it ends in a newline."""
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def _imports(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]
    return names


def library_cli_edges(path: str, tree: ast.AST, root: str) -> list[str]:
    rel = os.path.relpath(path, root)
    if rel.startswith(os.path.join("vkit", "cli") + os.sep):
        return []
    hits = {n for n in _imports(tree) if n == "vkit.cli" or n.startswith("vkit.cli.")}
    # importlib.import_module(f"vkit.cli.{tool}") counts as an edge too
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            arg = node.args[0] if node.args else None
            text = ast.unparse(arg) if arg is not None else ""
            if "vkit.cli" in text:
                hits.add(f"import_module({text})")
    return [f"{rel} -> {h}" for h in sorted(hits)]


def long_functions(path: str, tree: ast.AST, root: str) -> list[dict]:
    rel = os.path.relpath(path, root)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > FUNCTION_LINES:
                out.append({"function": f"{rel}:{node.name}", "lines": n})
    return sorted(out, key=lambda r: -r["lines"])


def code_lines(node: ast.AST, text_lines: list[str]) -> int:
    """Lines of ``node`` that hold code: not blank, not a comment, not inside a docstring."""
    doc: set[int] = set()
    for n in ast.walk(node):
        if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body:
            first = n.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                doc.update(range(first.lineno, first.end_lineno + 1))
    return sum(1 for i in range(node.lineno, node.end_lineno + 1)
               if i not in doc and text_lines[i - 1].strip() and not text_lines[i - 1].strip().startswith("#"))


def class_shapes(path: str, tree: ast.AST, text: str, root: str) -> list[dict]:
    """Every class of a module: its methods (defined in its body, properties included) and code lines."""
    rel = os.path.relpath(path, root)
    lines = text.split("\n")
    return [{"class": f"{rel}:{n.name}", "methods": sum(isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) for b in n.body),
             "code_lines": code_lines(n, lines)}
            for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]


def duplicate_pairs(root: str) -> dict | None:
    exe = shutil.which("duplicates")
    if exe is None:
        return None
    p = subprocess.run([exe, "--repo", os.path.join(root, "vkit"), "--most", "200", "--seconds", "120"],
                       capture_output=True, text=True, timeout=300)
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith("D")]
    more = [ln for ln in p.stdout.splitlines() if ln.startswith("(+") and "more pairs" in ln]
    return {"pairs": len(rows), "not_boilerplate": sum("boilerplate" not in r for r in rows), "more": more,
            "first_line": p.stdout.splitlines()[0] if p.stdout else ""}


def measure(root: str) -> dict:
    edges, longf, big, cli_sizes, classes = [], [], [], {}, []
    for path in modules(root):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        tree = ast.parse(text, path)
        n = module_lines(text)
        rel = os.path.relpath(path, root)
        if n > MODULE_LINES:
            big.append({"module": rel, "lines": n})
        if rel.startswith(os.path.join("vkit", "cli") + os.sep):
            cli_sizes[rel] = n
        edges += library_cli_edges(path, tree, root)
        longf += long_functions(path, tree, root)
        classes += class_shapes(path, tree, text, root)
    largest = max(cli_sizes.items(), key=lambda kv: kv[1]) if cli_sizes else (None, 0)
    return {
        "repo": os.path.abspath(root),
        "library_cli_edges": len(edges), "edges": edges,
        f"modules_over_{MODULE_LINES}_lines": len(big), "big_modules": sorted(big, key=lambda r: -r["lines"]),
        f"functions_over_{FUNCTION_LINES}_lines": len(longf), "long_functions": sorted(longf, key=lambda r: -r["lines"]),
        f"classes_over_{CLASS_METHODS}_methods_or_{CLASS_CODE_LINES}_code_lines": [
            c for c in sorted(classes, key=lambda c: -c["methods"]) if c["methods"] > CLASS_METHODS or c["code_lines"] > CLASS_CODE_LINES],
        "largest_classes": sorted(classes, key=lambda c: (-c["methods"], -c["code_lines"]))[:6],
        "largest_cli_module": {"module": largest[0], "lines": largest[1]},
        "duplicates_in_vkit": duplicate_pairs(root),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="example: python3 bench/code_shape.py . -o bench/results/code_shape.json")
    ap.add_argument("repo", nargs="?", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("-o", "--output", help="also write the JSON here")
    args = ap.parse_args(argv)
    if not os.path.isdir(os.path.join(args.repo, "vkit")):
        print(f"code_shape: error: {args.repo} has no vkit/ folder", file=sys.stderr)
        return 2
    doc = measure(args.repo)
    text = json.dumps(doc, indent=1)
    print(text)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
