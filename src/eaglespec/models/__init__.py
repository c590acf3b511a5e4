"""The target model: compact decoder, weight loading, bundled-model registry and fetcher."""
