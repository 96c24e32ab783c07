"""The HTML pages of nmt-cli, `nmt serve`'s (serve/page.html) and `nmt export --format web`'s
(interop/web.html), with one look: page.css, put into each where its style says PAGE_CSS."""

from __future__ import annotations

from importlib import resources


def page(package: str, name: str) -> str:
    """The page `name` of `package` with the shared style in it."""
    css = resources.files("nmt_cli").joinpath("page.css").read_text(encoding="utf-8")
    return resources.files(package).joinpath(name).read_text(encoding="utf-8").replace("PAGE_CSS", css)
