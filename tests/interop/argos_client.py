"""Run in a virtual environment of argostranslate's own (tests/interop/test_argos.py), never the
project's: install the packages named on standard input into ARGOS_PACKAGES_DIR and, with
`texts`, translate each with argostranslate.translate.translate. JSON in, JSON out."""

import json
import sys

import argostranslate.package
import argostranslate.translate

request = json.load(sys.stdin)
for package in request["packages"]:
    argostranslate.package.install_from_path(package)
json.dump([argostranslate.translate.translate(text, request["from"], request["to"])
           for text in request.get("texts", [])], sys.stdout)
