"""Export a sentence-embedding checkpoint to the ONNX models Triton serves."""
