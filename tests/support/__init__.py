"""What several test modules share: helpers (recipes, the CLI in process, error checks, comparisons), the runs
and problems several tests read, and the checks of algorithms and spectra that several test modules run."""
