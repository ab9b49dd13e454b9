"""Compare a backend's outputs with the PyTorch reference (built on Polygraphy's Comparator)."""
