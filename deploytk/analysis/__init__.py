"""Static analysis of a reference model: token schedule and FLOPs."""
