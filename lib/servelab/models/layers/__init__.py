"""Building blocks of the project's own model code: norms, rotary embeddings, paged attention."""
