"""The one exception type the CLI turns into a one-line message (no traceback)."""


class LandscapeError(Exception):
    """A problem with the user's input or files, explained in one line."""
