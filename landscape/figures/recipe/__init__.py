"""Figure recipes (figures/*.toml): the recipe read and checked (``figure``, ``FigureRecipe``), the schema of its
tables (``tables``) and the rounds its runs will have and its plots analyse (``rounds``)."""
