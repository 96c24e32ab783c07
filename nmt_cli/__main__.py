"""`python -m nmt_cli` is `nmt`."""

from nmt_cli.cli import main

main()
