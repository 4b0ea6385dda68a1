"""Loss surfaces: the grid of a surface and its parsers (``grid``), the evaluation of its cells (``evaluation``),
the partial grid an interrupted surface resumes from (``partial``) and the computation of one surface of a
checkpoint (``compute``, imported when the surface pass runs)."""
