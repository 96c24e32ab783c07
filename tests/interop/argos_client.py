"""argostranslate, run as its users run it, for the tests and the benchmarks: `translate` runs this
file in a virtual environment of argostranslate's own (never the project's), which installs the
packages into a fresh folder and translates each text with argostranslate.translate.translate,
offline; `sentences` splits texts as argostranslate does before translating (its lines, then
MiniSBD with the package's own model), and `joined` puts translated sentences back together as it
does (a paragraph's with spaces, its paragraphs with newlines)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from pathlib import Path


def environment(where: Path) -> dict[str, str]:
    """argostranslate's environment: its folders under `where`, none of the project's variables."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(ARGOS_PACKAGES_DIR=str(where / "packages"), XDG_DATA_HOME=str(where / "data"),
               XDG_CACHE_HOME=str(where / "cache"), XDG_CONFIG_HOME=str(where / "config"), ARGOS_DEVICE_TYPE="cpu")
    return env


def translate(python: Path, packages: Iterable[Path], texts: list[str], where: Path,
              pair: tuple[str, str] = ("src", "tgt")) -> list[str]:
    """argostranslate's translations of `texts` (none: only install) with `packages` installed into
    `where`, by the interpreter `python` of its own environment."""
    request = {"packages": [str(p) for p in packages], "from": pair[0], "to": pair[1], "texts": texts}
    done = subprocess.run([str(python), __file__], input=json.dumps(request), capture_output=True, text=True,
                          env=environment(where), timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout)


def sentences(package: Path, texts: list[str], where: Path) -> list[list[list[str]]]:
    """Each text's paragraphs (its lines), each split into sentences by MiniSBD with the package's
    own model, as argostranslate splits them."""
    import minisbd

    with zipfile.ZipFile(package) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".onnx")]
        z.extract(name, where)
    splitter = minisbd.SBDetect(str(where / name), use_gpu=False)
    return [[splitter.sentences(paragraph) for paragraph in text.split("\n")] for text in texts]


def joined(translations: Iterable[str], split: list[list[list[str]]]) -> list[str]:
    """The translations of the sentences of `split` (in order) put back together as argostranslate does."""
    each = iter(translations)
    return ["\n".join(" ".join(next(each) for _ in paragraph) for paragraph in text) for text in split]


def main() -> None:
    import argostranslate.package
    import argostranslate.translate

    request = json.load(sys.stdin)
    for package in request["packages"]:
        argostranslate.package.install_from_path(package)
    json.dump([argostranslate.translate.translate(text, request["from"], request["to"])
               for text in request.get("texts", [])], sys.stdout)


if __name__ == "__main__":
    main()
