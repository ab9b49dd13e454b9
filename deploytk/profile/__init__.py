"""Latency of the merged model vs the same weights without merging, measured in one run."""
