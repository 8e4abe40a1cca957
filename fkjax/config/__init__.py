"""A run's config: the schema every key obeys, dotted keys, the run's saved record."""
