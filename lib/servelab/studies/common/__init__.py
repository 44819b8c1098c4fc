"""What every study shares: parameter handling (profiles, overrides, validation), the trained model family."""
