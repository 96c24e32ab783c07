"""The error a user is shown."""


class NmtError(ValueError):
    """A problem with the user's input or files. The message is the whole story (file, line,
    cause); the command line prints it on one line, without a traceback. A ValueError, so that
    code catching a bad value (as for any Python library) catches it too."""
