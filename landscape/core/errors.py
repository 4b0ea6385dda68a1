"""The one exception type the CLI turns into a one-line message (no traceback)."""


class LandscapeError(Exception):
    """A problem with the user's input or files, explained in one line."""


def shown(text: str, limit: int = 80) -> str:
    """Text for a one-line message: as it is, or its start and its length when it is long (a key or value of
    megabytes is named, never echoed in full)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"
