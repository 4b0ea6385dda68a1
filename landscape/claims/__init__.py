"""Claims: published comparisons stated in claims/*.toml, checked over seeds with their statistics."""
