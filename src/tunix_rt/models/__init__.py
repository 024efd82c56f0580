"""Model presets, weight import and tiny random models for tests."""
