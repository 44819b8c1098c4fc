"""A family of small language models trained offline on installed Python source (Studies 3 and 6)."""
