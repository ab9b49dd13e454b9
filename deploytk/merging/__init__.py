"""The framework the token-reduction methods run in: ``MergedViT`` (a timm ViT run with a method at a
static schedule, the PyTorch reference every backend is held to), ``Reduction`` and the method
registry, schedules, keep-rate planning and fp16/bf16 casting. The methods are in ``deploytk.reducers``."""
