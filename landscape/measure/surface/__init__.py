"""Loss surfaces of a model in memory: the grid of a surface and its parsers (``grid``) and the evaluation of its
cells (``evaluation``). A run's surfaces (resumed from a partial grid, filed as results) are computed by
``landscape.analyze.surface``."""
