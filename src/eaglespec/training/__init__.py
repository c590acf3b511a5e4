"""Training EAGLE heads: data, feature extraction, trainer."""
