"""Fitted models in formats other programs serve: ONNX (``pip install "daskkrr[onnx]"``).

>>> from daskkrr.export import to_onnx  # doctest: +SKIP
>>> onx = to_onnx(model)                # doctest: +SKIP

Importing this package needs neither skl2onnx nor onnx; the functions that
build a model import them and say how to install them when they are absent.
"""

from daskkrr.export.onnx import OnnxExportError, register_converters, save_onnx, to_onnx

__all__ = ["OnnxExportError", "register_converters", "save_onnx", "to_onnx"]
