"""A run's loss surfaces: the computation of one surface of a checkpoint (``compute``, imported when the surface
pass runs) and the partial grid an interrupted surface resumes from (``partial``); the grid and the evaluation of
its cells are in ``landscape.measure.surface``."""
