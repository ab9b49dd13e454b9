"""Static analysis of a reference model: FLOPs (fvcore convention) and `deploytk inspect` (schedule, options, FLOPs)."""
