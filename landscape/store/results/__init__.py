"""The result store: what one analysis pass wrote for one checkpoint, ``analysis/round-NNNN/<name>.json`` and
``<name>.npz``. Its name from the pass and its settings (``names``: the one naming rule, and the settings of
results told apart), its record and files (``files``: built, written, found again by settings), a pass's result
as JSON and arrays (``serial``), the stored results read back and tabled (``records``), and which of them a
figure, a comparison or a report reads (``selection``: the queries by settings)."""
