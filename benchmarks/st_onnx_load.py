"""sentence-transformers' own ONNX backend on folders ``bertforge export onnx`` wrote: the vectors (scores) of
``SentenceTransformer(OUT, backend="onnx")`` (``CrossEncoder`` for a reranker) against its torch backend on the
same folder, fp32 and int8.

Its ONNX backend goes through Optimum, which installs only beside transformers 4.x, so this runs in a virtual
environment of its own, not the project's:

    python3 -m venv /tmp/st-onnx && /tmp/st-onnx/bin/pip install torch==2.13.0 sentence-transformers optimum-onnx onnxruntime
    /tmp/st-onnx/bin/python benchmarks/st_onnx_load.py embed runs/onnx/export-retrieval-model
    /tmp/st-onnx/bin/python benchmarks/st_onnx_load.py rerank runs/onnx/export-rerank-minilm-s0
"""

from __future__ import annotations

import sys

import numpy as np

QUERIES = ["where does anna work", "who wrote the book", "what is the capital of france"]
PASSAGES = ["anna works at the fish market in oslo", "the book was written by ada lovelace in 1843",
            "paris is the capital and largest city of france"]
INT8 = "onnx/model_qint8_avx512_vnni.onnx"


def main() -> int:
    kind, folder = sys.argv[1], sys.argv[2]
    import sentence_transformers
    import transformers

    print(f"sentence-transformers {sentence_transformers.__version__}, transformers {transformers.__version__}")
    if kind == "embed":
        cls, run = sentence_transformers.SentenceTransformer, lambda m: m.encode(QUERIES + PASSAGES)
    else:
        cls, run = sentence_transformers.CrossEncoder, lambda m: m.predict(list(zip(QUERIES, PASSAGES)))
    ref = run(cls(folder, device="cpu"))
    for name, kw in (("onnx fp32", {"file_name": "onnx/model.onnx"}), ("onnx int8", {"file_name": INT8})):
        got = run(cls(folder, backend="onnx", device="cpu", model_kwargs=kw))
        print(f"{name}: largest difference from the torch backend {float(np.abs(got - ref).max()):.2g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
