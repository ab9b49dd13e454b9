"""PyTorch reference of token reduction for timm ViTs: the ground truth every backend is held to."""
