"""wslib."""
