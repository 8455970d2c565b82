"""Vocabulary extension (``pretrain --init MODEL --add-vocab N``): a model's WordPiece vocabulary grown by the
words and subwords of a new corpus, every old id kept.

* :func:`new_tokens`: the candidates.  A WordPiece vocabulary of ``old size + N`` entries is trained on the
  corpus with the old tokenizer's normaliser and pre-tokeniser (so its entries are spelled as the old
  tokenizer sees text); the first :data:`SAMPLE_CHARS` characters of the corpus are tokenized with it, and
  the entries the old vocabulary lacks are ranked by how often that tokenization uses them (ties by
  spelling), keeping those used at least :data:`MIN_USES` times.  Use, not the trainer's order: the
  trainer orders entries by when their last merge happened, which favours the pieces a longer word is
  built of over the word.
* :func:`extend_tokenizer`: the old tokenizer with the new entries appended to its WordPiece vocabulary at
  ids ``old size ...`` (real entries: transformers' "added tokens" are split out before WordPiece runs, so
  a ``##`` continuation could never be one); normaliser, pre-tokeniser and post-processor are the old ones.
* :func:`extend_model`: the token embeddings, the MLM decoder (still tied to them) and its bias grown to the
  tokenizer's size, in every family (its table through ``get_input_embeddings``, its output layer through
  ``grow_output_layer``).  A new entry's embedding starts as the mean of the rows of the pieces the old
  tokenizer splits it into, and so does its decoder bias: the new token's logit then starts as the mean of its
  pieces' logits, never above the largest of them, so the new rows do not pull the predictions away from
  the model's until training moves them (a zero bias would put a new token above its pieces wherever, as
  usual, their biases are negative).

Pieces of an entry, as the old tokenizer splits it: a whole word ``xyz`` by the old WordPiece model itself;
a continuation ``##xyz`` by the same greedy longest match started as a continuation, i.e. its first piece
is a ``##`` entry too (WordPiece over the old ``##`` entries alone, each of which may also start the
word).  A piece the old vocabulary cannot spell is [UNK], and [UNK]'s row counts.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator

import torch
from tokenizers import Tokenizer, trainers
from tokenizers.models import WordPiece
from torch import nn

from .errors import UserError, shown
from .tokenizer import SPECIAL_TOKENS, UNK, encode_batch, vocab_tokens

PREFIX = "##"
SAMPLE_CHARS = 1 << 24  # the corpus sample that ranks the candidates
MIN_USES = 2  # as the trainer's min_frequency: an entry seen once is no part of the domain's vocabulary


def check_extensible(tok: Tokenizer, where: str) -> None:
    """Only a WordPiece vocabulary with ``##`` continuations is extended."""
    kind = type(tok.model).__name__
    if kind != "WordPiece":
        raise UserError(f"--add-vocab extends a WordPiece vocabulary; {where} is "
                        f"{'word-level' if kind == 'WordLevel' else kind}")
    ids = sorted(tok.get_vocab(with_added_tokens=True).values())
    if ids != list(range(len(ids))):  # new entries take the ids after the old: each old id must have its token
        raise UserError(f"--add-vocab extends a vocabulary whose ids are 0 to n-1, one token each; {where} has "
                        "an id without a token (a line repeated in its vocab.txt?)")
    prefix = json.loads(tok.to_str())["model"].get("continuing_subword_prefix")
    if prefix != PREFIX:
        raise UserError(f"--add-vocab extends a WordPiece vocabulary with ## continuations; {where} marks them "
                        f"with {shown(prefix)}")


def new_tokens(tok: Tokenizer, texts: Iterable[str], n: int, show_progress: bool = False) -> list[str]:
    """Up to ``n`` entries absent from ``tok``'s vocabulary, most used first (see the module's docstring)."""
    sample: list[str] = []
    trained = Tokenizer(WordPiece(unk_token=UNK, continuing_subword_prefix=PREFIX, max_input_chars_per_word=100))
    trained.normalizer, trained.pre_tokenizer = tok.normalizer, tok.pre_tokenizer
    size = tok.get_vocab_size(with_added_tokens=True)
    # no more than SAMPLE_CHARS // MIN_USES entries can be used MIN_USES times in the sample: a larger n asks the
    # trainer for nothing more, and it reserves room for the whole target (10**12 aborts the process)
    target = size + min(n, SAMPLE_CHARS // MIN_USES)
    trainer = trainers.WordPieceTrainer(vocab_size=target, min_frequency=MIN_USES, special_tokens=SPECIAL_TOKENS,
                                        continuing_subword_prefix=PREFIX, limit_alphabet=1000,
                                        show_progress=show_progress)
    trained.train_from_iterator(_keeping_sample(texts, sample), trainer=trainer)
    old = tok.get_vocab(with_added_tokens=True)
    uses: Counter[str] = Counter()
    for i in range(0, len(sample), 1000):
        for ids in encode_batch(trained, sample[i:i + 1000]):
            uses.update(trained.id_to_token(j) for j in ids)
    ranked = sorted((t for t, c in uses.items() if c >= MIN_USES and t not in old and t not in SPECIAL_TOKENS),
                    key=lambda t: (-uses[t], t))
    return ranked[:n]


def _keeping_sample(texts: Iterable[str], sample: list[str]) -> Iterator[str]:
    """``texts`` as they are, the first :data:`SAMPLE_CHARS` characters of them kept in ``sample``."""
    kept = 0
    for text in texts:
        if kept < SAMPLE_CHARS:
            sample.append(text[:SAMPLE_CHARS - kept])
            kept += len(sample[-1])
        yield text


def extend_tokenizer(tok: Tokenizer, tokens: list[str]) -> Tokenizer:
    """``tok`` with ``tokens`` appended to its vocabulary (ids from its size on), all else as it was."""
    state = json.loads(tok.to_str())
    vocab = state["model"]["vocab"]
    start = tok.get_vocab_size(with_added_tokens=True)
    for i, t in enumerate(tokens):
        if t in vocab:
            raise ValueError(f"{t!r} is in the vocabulary already")
        vocab[t] = start + i
    return Tokenizer.from_str(json.dumps(state))


def old_pieces(tok: Tokenizer, tokens: list[str], size: int | None = None) -> list[list[int]]:
    """The ids of the pieces into which the old vocabulary (``tok``'s first ``size`` ids; all of them when
    None) splits each entry (a ``##`` entry as a continuation)."""
    state = json.loads(tok.to_str())["model"]
    vocab = {t: i for t, i in state["vocab"].items() if size is None or i < size}
    unk, longest = state["unk_token"], state["max_input_chars_per_word"]
    whole = WordPiece(vocab, unk_token=unk, continuing_subword_prefix=PREFIX, max_input_chars_per_word=longest)
    continuations = {t: i for t, i in vocab.items() if t.startswith(PREFIX)}
    # a vocabulary of the ## entries alone, in which each may also start the word (spelled without its ##)
    starts = {t[len(PREFIX):]: i for t, i in continuations.items() if not t[len(PREFIX):].startswith(PREFIX)}
    as_continuation = WordPiece({**continuations, **starts, unk: vocab[unk]}, unk_token=unk,
                                continuing_subword_prefix=PREFIX, max_input_chars_per_word=longest)
    out = []
    for t in tokens:
        if t.startswith(PREFIX) and len(t) > len(PREFIX):
            out.append([p.id for p in as_continuation.tokenize(t[len(PREFIX):])])
        else:
            out.append([p.id for p in whole.tokenize(t)])
    return out


def extend_model(model: nn.Module, tok: Tokenizer) -> list[str]:
    """Grow ``model`` (of any family, with or without its MLM head) to ``tok``'s vocabulary, which extends the
    model's; return the new entries.  New rows start as the mean of their old pieces' (module docstring)."""
    old_n, new_n = model.config.vocab_size, tok.get_vocab_size(with_added_tokens=True)
    if new_n == old_n:
        return []
    if new_n < old_n:
        raise UserError(f"the tokenizer has {new_n} tokens, fewer than the model's {old_n}: it does not extend it")
    emb = model.get_input_embeddings()  # the family's token table
    if emb.num_embeddings != old_n:
        raise UserError(f"the model's embedding table has {emb.num_embeddings} rows, its config.json says "
                        f"vocab_size {old_n}")
    tokens = vocab_tokens(tok)[old_n:]
    pieces = old_pieces(tok, tokens, old_n)
    with torch.no_grad():
        model.set_input_embeddings(_grown(emb, pieces))
        model.grow_output_layer(lambda t: torch.cat([t, _means(t, pieces)]))  # (a weight's rows, or a bias)
    model.config.vocab_size = new_n
    model.tie_weights()  # the decoder is the grown embedding matrix again
    return tokens


def _grown(old: nn.Embedding, pieces: list[list[int]]) -> nn.Embedding:
    """A copy of the token table ``old`` with a row for each list of ``pieces``: the mean of those pieces' rows."""
    new = nn.Embedding(old.weight.shape[0] + len(pieces), old.embedding_dim, padding_idx=old.padding_idx).to(old.weight)
    new.weight.copy_(torch.cat([old.weight, _means(old.weight, pieces)]))
    return new


def _means(rows: torch.Tensor, pieces: list[list[int]]) -> torch.Tensor:
    """(len(pieces), C), or (len(pieces),) for a bias: the mean of ``rows``' rows of each list of ids."""
    return torch.stack([rows[torch.tensor(p, dtype=torch.long, device=rows.device)].mean(0) for p in pieces])


def describe(tok: Tokenizer, before: int, asked: int) -> str:
    """The log's line about ``tok``, a vocabulary of ``before`` tokens extended by ``--add-vocab asked``."""
    tokens = vocab_tokens(tok)[before:]
    if not tokens:
        return f"--add-vocab {asked}: the data holds no word or subword that the vocabulary lacks; it stays as it was"
    examples = ", ".join(tokens[:8])
    short = f" (the data gave {len(tokens)} of the {asked} asked for)" if len(tokens) < asked else ""
    return (f"added {len(tokens)} tokens to the vocabulary ({before} -> {before + len(tokens)}){short}, the most used "
            f"first: {examples}")
