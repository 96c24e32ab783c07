"""The package's shape: modules in layers that import only downward, no import circles, model.py
the paper alone (torch and its architecture), and no module over 400 lines."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "nmt_cli"
MODULE_LINES = 400

# Lowest first: a module imports modules of its own layer or of lower ones, never of a higher one.
LAYERS = (
    ("foundations", {"errors", "version", "options", "files", "lines", "vocab", "moses"}),
    ("settings, text and data", {"architecture", "config", "run_config", "released", "bpe", "pieces", "text",
                                 "data", "datadir"}),
    ("the paper's model", {"model"}),
    ("fast paths and decoding", {"kernels", "device", "decoding", "graphs", "controls", "constraints", "ensemble",
                                 "search", "sampling"}),
    ("models in use", {"checkpoint", "averaging", "report", "shortlist", "generator", "pipeline", "records", "peers",
                       "schedule", "runtime", "trainer", "epochs", "progress", "runlog", "savedir", "workers", "score",
                       "plot", "release", "release_transformers", "release_marian"}),
    ("the commands and the API", {"translator", "card", "translate", "train", "preprocess", "export", "marian", "serve",
                                  "importer", "batcher", "connections", "schemas", "access", "metrics", "pairs",
                                  "libretranslate"}),
    ("the command line and the package", {"flags", "command", "cli", "__main__", "__init__"}),
)


def module_imports(path: Path) -> tuple[set[str], set[str]]:
    """The package modules and the other top-level modules that a module imports, anywhere in it
    (a function's import too), except under `if TYPE_CHECKING:` (types only)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {id(n) for node in ast.walk(tree)
               if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING" for n in ast.walk(node)}
    ours, others = set(), set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "nmt_cli":
                ours |= {alias.name for alias in node.names}
            elif node.module.startswith("nmt_cli."):
                ours.add(node.module.split(".")[1])
            elif node.level == 0:
                others.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                (ours.add(alias.name.split(".")[1]) if alias.name.startswith("nmt_cli.")
                 else others.add(alias.name.split(".")[0]))
    return ours - {path.stem}, others


def graph() -> dict[str, set[str]]:
    return {path.stem: module_imports(path)[0] for path in PACKAGE.glob("*.py")}


def test_every_module_has_a_layer_and_imports_only_downward():
    layer = {name: level for level, (_, names) in enumerate(LAYERS) for name in names}
    assert set(graph()) == set(layer), "a module without a layer, or a layer naming no module"
    upward = [f"{module} ({LAYERS[layer[module]][0]}) imports {other} ({LAYERS[layer[other]][0]})"
              for module, imported in graph().items() for other in imported if layer[other] > layer[module]]
    assert not upward, "\n".join(upward)


def test_no_import_circles():
    imports, done, path = graph(), set(), []

    def visit(module: str) -> None:
        assert module not in path, f"import circle: {' -> '.join(path[path.index(module):] + [module])}"
        if module in done:
            return
        path.append(module)
        for other in sorted(imports[module]):
            visit(other)
        path.pop()
        done.add(module)

    for module in sorted(imports):
        visit(module)


def test_the_model_is_the_paper_alone():
    """model.py imports torch and its architecture only: the fast paths (kernels.py), the search's
    decoding (decoding.py) and quantization reach it from outside, as module swaps."""
    ours, others = module_imports(PACKAGE / "model.py")
    assert ours == {"architecture"} and others <= {"__future__", "math", "typing", "torch"}, (ours, others)
    source = (PACKAGE / "model.py").read_text(encoding="utf-8")
    for marker in ("torch.ops.", "mkldnn", "device.type", "is_cuda", "ctypes", "int8_projection", "step: bool"):
        assert marker not in source, marker


def test_no_module_is_over_400_lines():
    long = {path.name: n for path in PACKAGE.glob("*.py") if (n := len(path.read_text().splitlines())) > MODULE_LINES}
    assert not long, long


def test_the_checks_catch_what_they_look_for(tmp_path):
    """The import reader sees a function's import and skips a TYPE_CHECKING one."""
    module = tmp_path / "sample.py"
    module.write_text("from typing import TYPE_CHECKING\nimport torch\nfrom nmt_cli import checkpoint as ckpt\n"
                      "if TYPE_CHECKING:\n    from nmt_cli.model import Transformer\n"
                      "def f():\n    from nmt_cli.search import beam_search\n")
    assert module_imports(module) == ({"checkpoint", "search"}, {"typing", "torch"})
