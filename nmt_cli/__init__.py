"""nmt-cli: the Transformer of "Attention Is All You Need", as a command-line toolkit."""

__version__ = "0.1.0"


class NmtError(Exception):
    """A problem with the user's input or files. The message is the whole story (file, line,
    cause); the command line prints it on one line, without a traceback."""
