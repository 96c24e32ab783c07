"""The error a user is shown."""


class NmtError(Exception):
    """A problem with the user's input or files. The message is the whole story (file, line,
    cause); the command line prints it on one line, without a traceback."""
