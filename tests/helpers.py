"""Helpers for tests: small models built on the spot (nothing downloaded)."""

from __future__ import annotations

import torch

from bertforge import BertConfig, BertForPreTraining
from bertforge.tokenizer import train_tokenizer


def tiny_model_dir(path, texts, vocab_size=800, seed=0, kind="wordpiece") -> str:
    """A randomly initialised tiny BERT with a tokenizer trained on ``texts``, saved as a model directory."""
    tok = train_tokenizer(texts, vocab_size, kind=kind, min_frequency=1)
    torch.manual_seed(seed)
    cfg = BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), max_position_embeddings=512)
    BertForPreTraining(cfg).save_pretrained(str(path), tokenizer=tok)
    return str(path)
