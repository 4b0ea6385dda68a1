// MathJax's settings, read by javascripts/mathjax/tex-svg-full.js (copied into the site from the PyPI package
// django-static-mathjax by tools/docs_hooks.py; see mkdocs.yml). pymdownx.arithmatex (generic mode) writes every
// formula as \( ... \) or \[ ... \] inside an element of class "arithmatex": only those are typeset.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
    packages: { "[-]": ["noundefined"] },  // an unknown macro is an error (merror), not red text
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex|md-ellipsis",  // the formulas, and those of headings in the contents (their links)
  },
  svg: { fontCache: "global" },  // SVG paths, no web fonts: a browser loads no font from a file:// page
};
