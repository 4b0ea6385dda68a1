"""Workflows: the only place the stages (train, analyze, figures, claims) are wired together.

Each takes plain arguments (paths, recipes, settings), returns its results or raises ``LandscapeError``, and
prints nothing: a ``notify`` callable receives its progress lines and notes. The CLI (``landscape.cli``)
parses flags, calls one and prints; a notebook calls the same functions.
"""
