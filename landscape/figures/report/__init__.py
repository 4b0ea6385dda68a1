"""The self-contained HTML report over runs: the page built and written (``build``), the numbers of its tables
(``data``), its HTML parts rendered from the jinja2 templates (``parts``), its plotly figures (``plots``) and its
surfaces section (``surfaces``)."""
