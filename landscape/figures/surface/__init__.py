"""Loss-surface figures: the files of the ``surface`` pass read (``data``: ``SurfaceData``, ``load_surface``), their
colour scales and ticks (``scale``) and the figures drawn from them (``draw``: contours, 3D surfaces, panels)."""
