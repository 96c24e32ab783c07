"""Run in a virtual environment of argostranslate's own (tests/interop/test_argos.py), never the
project's: install the package named on standard input into ARGOS_PACKAGES_DIR, translate each text
with argostranslate.translate.translate, and say how MiniSBD (the package's minisbd/*.onnx, as
argostranslate splits with it) splits each paragraph (line) of each text into sentences. JSON in, JSON
out."""

import json
import sys

import argostranslate.package
import argostranslate.translate
from minisbd import SBDetect

request = json.load(sys.stdin)
argostranslate.package.install_from_path(request["package"])
translations = [argostranslate.translate.translate(text, request["from"], request["to"]) for text in request["texts"]]
(installed,) = argostranslate.package.get_installed_packages()
splitter = SBDetect(str(next((installed.package_path / "minisbd").glob("*.onnx"))), use_gpu=False)
paragraphs = [text.split("\n") for text in request["texts"]]  # as argostranslate splits a text first
json.dump({"translations": translations,
           "sentences": [[splitter.sentences(paragraph) for paragraph in text] for text in paragraphs]}, sys.stdout)
