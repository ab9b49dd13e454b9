"""Accuracy evaluation: ImageFolder top-1/top-5 of the dense model, the merged reference and ONNX Runtime.

``digits`` turns scikit-learn's bundled 8x8 digits into a small ImageFolder tree (the data the
shipped ``assets/digits_vit`` model was trained on); ``accuracy`` is the harness behind
``deploytk eval``.
"""

from deploytk.evaluation.accuracy import ImageFolder, evaluate, scan_image_folder
from deploytk.evaluation.digits import write_digits_imagefolder

__all__ = ["ImageFolder", "evaluate", "scan_image_folder", "write_digits_imagefolder"]
