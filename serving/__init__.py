"""A real Triton Inference Server on this machine, for the serving tests and the load benchmark (see README.md)."""
