"""Figures: static (matplotlib, Agg, PNG/PDF) and interactive (plotly HTML) renderers.

Figures read only files: run directories and analysis outputs (``analysis/round-NNNN/<pass>.json|npz``),
never models. ``landscape.figures.surface.draw`` draws the loss surfaces of the ``surface`` pass.
"""
