"""Example quantized models built in code (no downloads), for the demo, the bench and the tests.

Not part of the refcodegen package (the wheel ships the compiler only): imported from the repository
root. ``networks``: Relay networks; ``onnx_models``, ``torch_models``, ``tflite_models``: models made
the way each framework's users make them, then imported through refcg's frontends.
"""
