"""The code's shape as issue 44 measures it: every class over 500 lines and every function over
60 in the given folders (by line span, decorators excluded), largest first, and their count.

Usage:  python bench/code_sizes.py operator gateway runtime
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

CLASS_LIMIT = 500
FUNCTION_LIMIT = 60


def over_limits(folders: list[str]) -> list[tuple[int, str, str, str]]:
    """(lines, kind, path, name) of each class or function over its limit."""
    found = []
    for folder in folders:
        for path in sorted(Path(folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    is_class = isinstance(node, ast.ClassDef)
                    if lines > (CLASS_LIMIT if is_class else FUNCTION_LIMIT):
                        kind = "class" if is_class else "function"
                        found.append((lines, kind, str(path), node.name))
    return sorted(found, reverse=True)


def main() -> int:
    found = over_limits(sys.argv[1:] or ["operator", "gateway", "runtime"])
    for lines, kind, path, name in found:
        print(f"{lines:5} {kind:8} {path} {name}")
    limits = f"class > {CLASS_LIMIT} lines, function > {FUNCTION_LIMIT}"
    print(f"{len(found)} over the limits ({limits})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
