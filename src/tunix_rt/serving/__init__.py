"""Serving a trained model: chat messages rendered with our template, a cache of loaded
models, and a scheduler that decodes concurrent requests together on the eval generator."""
