"""The package's shape: feature folders (wings) that import only the wings their rule names, the
root's foundations beneath them all and the command line above; no import circles; the paper's
model alone in model/transformer.py; no module over 400 lines, no function over 80, no class over 200."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "nmt_cli"
MODULE_LINES = 400
FUNCTION_LINES = 80
CLASS_LINES = 200
ROOT_MODULES = 16

# The root: foundations and settings, which import only each other, and the command line and the
# package, which may import anything.
FOUNDATIONS = {"errors", "version", "options", "files", "lines", "config", "run_config", "device", "score", "plot",
               "pages"}
ENTRY = {"cli", "command", "flags", "__main__", "__init__"}
# Each wing and the wings it may import (the root's foundations always), in the order they build on each other.
WINGS = {
    "text": (),
    "model": ("text",),
    "corpus": ("text", "model"),
    "decode": ("text", "model", "corpus"),
    "train": ("text", "model", "corpus", "decode"),
    "serve": ("text", "model", "decode"),
    "interop": ("text", "model", "decode"),
}


def module_name(path: Path) -> str:
    """`decode.search` for nmt_cli/decode/search.py, `files` for nmt_cli/files.py."""
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


def module_imports(path: Path) -> tuple[set[str], set[str]]:
    """The package modules (dotted below nmt_cli) and the other top-level modules that a module
    imports, anywhere in it (a function's import too), except under `if TYPE_CHECKING:` (types
    only)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {id(n) for node in ast.walk(tree)
               if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING" for n in ast.walk(node)}
    ours, others = set(), set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "nmt_cli":
            below = node.module.removeprefix("nmt_cli").lstrip(".")
            for alias in node.names:  # a name is a module of that folder, or a name of the module
                dotted = f"{below}.{alias.name}".lstrip(".")
                ours.add(dotted if (PACKAGE / f"{dotted.replace('.', '/')}.py").exists() else below)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            others.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                (ours.add(alias.name.removeprefix("nmt_cli.")) if alias.name.startswith("nmt_cli.")
                 else others.add(alias.name.split(".")[0]))
    own = module_name(path) if path.is_relative_to(PACKAGE) else path.stem
    return ours - {own, ""}, others


def graph() -> dict[str, set[str]]:
    return {module_name(path): module_imports(path)[0] for path in PACKAGE.rglob("*.py")}


def place(module: str) -> str:
    """A module's wing, or `foundations` or `entry` at the root."""
    if "." in module:
        return module.split(".")[0]
    return "foundations" if module in FOUNDATIONS else "entry" if module in ENTRY else "unplaced"


def may_import(importer: str, imported: str) -> bool:
    here, there = place(importer), place(imported)
    if here == "entry" or there == "foundations" or here == there:
        return True
    return here in WINGS and there in WINGS[here]


def test_every_module_has_a_place_and_a_wing_a_rule():
    root = {path.stem for path in PACKAGE.glob("*.py")}
    assert root == FOUNDATIONS | ENTRY, "a root module without a place, or a place naming no module"
    assert len(root) <= ROOT_MODULES
    folders = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert folders == set(WINGS), "a folder without a rule, or a rule naming no folder"


def test_each_wing_imports_only_what_its_rule_allows():
    broken = [f"{module} ({place(module)}) imports {other} ({place(other)})"
              for module, imported in sorted(graph().items()) for other in sorted(imported)
              if not may_import(module, other)]
    assert not broken, "\n".join(broken)


def test_each_wings_docstring_says_what_it_holds_and_may_import():
    for wing, allowed in WINGS.items():
        doc = ast.get_docstring(ast.parse((PACKAGE / wing / "__init__.py").read_text(encoding="utf-8")))
        folders = [f"{name}/" for name in allowed]
        rule = ("It imports the root's foundations only." if not folders else
                f"It imports the root's foundations{', ' if len(folders) > 1 else ' and '}"
                f"{', '.join(folders[:-1])}{' and ' if len(folders) > 1 else ''}{folders[-1]}.")
        assert doc and doc.endswith(rule), f"{wing}/__init__.py should end with: {rule}"
        modules = {path.stem for path in (PACKAGE / wing).glob("*.py")} - {"__init__"}
        unnamed = [m for m in sorted(modules) if not re.search(rf"\b{m}\b", doc)]
        assert not unnamed, f"{wing}/__init__.py does not say what {unnamed} holds"


def test_no_import_circles():
    imports, done, path = graph(), set(), []

    def visit(module: str) -> None:
        assert module not in path, f"import circle: {' -> '.join(path[path.index(module):] + [module])}"
        if module in done:
            return
        path.append(module)
        for other in sorted(imports.get(module, ())):
            visit(other)
        path.pop()
        done.add(module)

    for module in sorted(imports):
        visit(module)


def test_the_model_is_the_paper_alone():
    """model/transformer.py imports torch and its architecture only: the fast paths (kernels), the
    search's decoding (decode/incremental) and quantization reach it from outside, as module swaps."""
    ours, others = module_imports(PACKAGE / "model/transformer.py")
    assert ours == {"model.architecture"} and others <= {"__future__", "math", "typing", "torch"}, (ours, others)
    source = (PACKAGE / "model/transformer.py").read_text(encoding="utf-8")
    for marker in ("torch.ops.", "mkldnn", "device.type", "is_cuda", "ctypes", "int8_projection", "step: bool"):
        assert marker not in source, marker


def test_no_module_is_over_400_lines():
    long = {str(path.relative_to(PACKAGE)): n for path in PACKAGE.rglob("*.py")
            if (n := len(path.read_text().splitlines())) > MODULE_LINES}
    assert not long, long


def test_no_function_over_80_lines_and_no_class_over_200():
    long = [f"{path.relative_to(PACKAGE)}: {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in PACKAGE.rglob("*.py") for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.end_lineno -
            node.lineno + 1 > (CLASS_LINES if isinstance(node, ast.ClassDef) else FUNCTION_LINES)]
    assert not long, "\n".join(long)


def test_the_checks_catch_what_they_look_for(tmp_path):
    """The import reader sees a function's import, a module named from its folder and a name of a
    module, and skips a TYPE_CHECKING one; the rule refuses an import a wing may not make."""
    module = tmp_path / "sample.py"
    module.write_text("from typing import TYPE_CHECKING\nimport torch\nfrom nmt_cli.model import checkpoint as ckpt\n"
                      "from nmt_cli import files\nif TYPE_CHECKING:\n    from nmt_cli.model.transformer import T\n"
                      "def f():\n    from nmt_cli.decode.search import beam_search\n")
    assert module_imports(module) == ({"model.checkpoint", "files", "decode.search"}, {"typing", "torch"})
    assert not may_import("serve.app", "train.run") and not may_import("model.checkpoint", "decode.search")
    assert not may_import("files", "text.vocab") and may_import("cli", "train.run")
    assert may_import("decode.search", "decode.controls") and may_import("train.run", "decode.generator")
