"""The documentation site's build hook (mkdocs.yml ``hooks:``): it puts MathJax into the built site, so that the
formulas render with no network at build or view time, from a served site or from the file system.

MathJax comes from the PyPI package django-static-mathjax (the ``docs`` and ``test`` extras of pyproject.toml:
MathJax's own release files, nothing of Django is imported): its single-file build ``tex-svg-full.js`` (the TeX
input with every extension, SVG output, so no font is loaded) is added to the site's files as
``javascripts/mathjax/tex-svg-full.js``, which mkdocs.yml's ``extra_javascript`` loads after the settings in
docs/javascripts/mathjax.js.
"""

from __future__ import annotations

from importlib import resources

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

MATHJAX = "javascripts/mathjax/tex-svg-full.js"


def mathjax_source() -> str:
    """The path of MathJax's ``tex-svg-full.js`` in the installed django-static-mathjax."""
    try:
        source = resources.files("mathjax") / "static" / "mathjax" / "es5" / "tex-svg-full.js"
    except ModuleNotFoundError:
        source = None
    if source is None or not source.is_file():
        raise PluginError("MathJax is not installed: pip install -e '.[docs]' (the package django-static-mathjax)")
    return str(source)


def on_files(files, config):
    """Add MathJax to the site's files (copied as it is into the built site)."""
    files.append(File.generated(config, MATHJAX, abs_src_path=mathjax_source()))
    return files
