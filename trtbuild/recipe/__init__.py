"""The recipe: schema, YAML loading with positions, its generated reference page."""
