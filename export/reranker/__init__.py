"""The cross-encoder reranker's export: a `*ForSequenceClassification` checkpoint with one label -> ONNX (FP32,
FP16, INT8) -> parity with sentence-transformers' `CrossEncoder.predict` -> the `reranker`, `reranker_tokenizer`
and `reranker_onnx` models beside `bge` in the same Triton repository (`python -m export.reranker`).

It reuses the embedding export's steps (checkpoint, tracing, precision variants, staging and atomic install) and
adds only what differs: the classification head, pair tokenization, the logit parity gate and the configs.
"""
