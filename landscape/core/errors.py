"""The one exception type the CLI turns into a one-line message (no traceback), and the warning it turns into a
one-line note."""

import unicodedata


class LandscapeError(Exception):
    """A problem with the user's input or files, explained in one line."""


class LandscapeNote(UserWarning):
    """A warning the command line prints as one ``note: ...`` line on stderr, each text once (on rank 0 under
    torchrun): something the user should know about what was read, not an error."""


class RecipeEditedWarning(LandscapeNote):
    """A run's recipe.toml differs from the recipe its checkpoints record (edited after training): the recorded
    recipe is used (``landscape.store.recorded``). The command line prints it as one ``note: ...`` line."""


class StaleResultWarning(LandscapeNote):
    """Results of a run left out by its readers because they are not current (``landscape.store.results.validity``):
    one warning per run, naming how many, which rounds, why, and the way out. The command line prints it as a
    ``note:`` line."""


# Control characters and line or paragraph separators: what would break a one-line message.
_LINE_BREAKING = ("Cc", "Zl", "Zp")


def shown(text: str, limit: int = 80) -> str:
    """Text for a one-line message: as it is, or its start and its length when it is long (a key or value of
    megabytes is named, never echoed in full); control characters (a newline in a key) written as escapes, so
    the message stays one line."""
    if any(unicodedata.category(c) in _LINE_BREAKING for c in text):
        text = "".join(c.encode("unicode_escape").decode("ascii") if unicodedata.category(c) in _LINE_BREAKING
                       else c for c in text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"
