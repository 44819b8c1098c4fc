"""Building blocks of the project's own model code: norms, rotary embeddings, the compiled-function cache."""
