"""The code stays readable in one sitting: no module over ~400 lines, no class over ~150, no
function over ~60 (the limits below allow the "about"), and model.py holds no machine-specific path."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "nmt_cli"
MODULE_LINES, CLASS_LINES, FUNCTION_LINES = 400, 160, 65


def sizes() -> list[tuple[str, str, int, int]]:
    """(module, kind, name, lines) of every module, class and function of the package."""
    found = []
    for path in sorted(PACKAGE.glob("*.py")):
        source = path.read_text(encoding="utf-8")
        found.append((path.name, "module", path.name, len(source.splitlines())))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                found.append((path.name, kind, node.name, node.end_lineno - node.lineno + 1))
    return found


def test_modules_classes_and_functions_are_short():
    limits = {"module": MODULE_LINES, "class": CLASS_LINES, "function": FUNCTION_LINES}
    too_long = [f"{module}: {kind} {name} has {lines} lines (limit {limits[kind]})"
                for module, kind, name, lines in sizes() if lines > limits[kind]]
    assert not too_long, "\n".join(too_long)


def test_the_model_reads_like_the_paper():
    """Private torch ops and device-specific branches live in kernels.py, not in model.py."""
    source = (PACKAGE / "model.py").read_text(encoding="utf-8")
    for marker in ("torch.ops.", "mkldnn", "device.type", "is_cuda", "ctypes"):
        assert marker not in source, marker
