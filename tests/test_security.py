"""No code from users' input or files is ever run: no eval/exec, no shell, safe checkpoint loading."""

import ast
from pathlib import Path

SOURCES = sorted((Path(__file__).resolve().parent.parent / "nmt_cli").rglob("*.py"))


def calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            yield name, node


def test_no_eval_exec_or_shell():
    assert len(SOURCES) >= 10
    for path in SOURCES:
        for name, node in calls(ast.parse(path.read_text())):
            builtin = isinstance(node.func, ast.Name) and name in {"eval", "exec", "compile", "__import__"}
            on_os = isinstance(node.func, ast.Attribute) and getattr(node.func.value, "id", "") == "os" and \
                name in {"system", "popen"}
            assert not (builtin or on_os), f"{path.name}:{node.lineno} {name}"
            for keyword in node.keywords:
                assert not (keyword.arg == "shell" and getattr(keyword.value, "value", False)), \
                    f"{path.name}:{node.lineno} shell=True"


def test_every_torch_load_is_weights_only():
    loads = 0
    for path in SOURCES:
        for name, node in calls(ast.parse(path.read_text())):
            on_torch = isinstance(node.func, ast.Attribute) and getattr(node.func.value, "id", "") == "torch"
            if name == "load" and on_torch:
                loads += 1
                assert any(k.arg == "weights_only" and k.value.value is True for k in node.keywords), \
                    f"{path.name}:{node.lineno}"
    assert loads >= 1
