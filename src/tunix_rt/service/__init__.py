"""The REST API and web UI over the registry (`tunix-rt serve`)."""
