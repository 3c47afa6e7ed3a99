"""Load tools against a running server: soak and chaos."""
