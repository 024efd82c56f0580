"""tunix-rt: teach small Gemma models to show their reasoning, and prove what they learned."""

__version__ = "0.1.0"
