"""ONNX preparation, shape-profile planning and TensorRT engine builds."""
