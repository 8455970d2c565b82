"""BERT tokenizers, built on the ``tokenizers`` library (no hand-written WordPiece).

* :func:`train_vocabulary` learns a WordPiece vocabulary (BERT normaliser and pre-tokeniser, ``##``
  continuations) or a word-level one (lower-cased words and punctuation: the demo's teaching default).
* :func:`save_tokenizer` writes ``vocab.txt``, ``tokenizer.json``, ``tokenizer_config.json`` and
  ``special_tokens_map.json``, so that ``transformers.AutoTokenizer.from_pretrained(dir)`` loads it and
  encodes exactly like ``tokenizers.Tokenizer.from_file(dir + "/tokenizer.json")``.
* :func:`load_tokenizer` returns a ready ``tokenizers.Tokenizer`` (with the BERT post-processor: [CLS] A
  [SEP] B [SEP], token types 0/1) from a model or tokenizer directory, or from a bare ``vocab.txt`` such as
  bert-base-uncased's, encoding exactly like ``transformers.BertTokenizerFast`` with that vocabulary.

Special tokens are looked up by name, never by position: ours put [PAD] [UNK] [CLS] [SEP] [MASK] at 0-4,
bert-base-uncased has them at 0, 100-103.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from tokenizers.models import WordLevel, WordPiece

from .atomic import write_file
from .errors import UserError, require_type, shown
from .files import read_json_object, read_text
from .outputs import MODEL_FILES, Output, register_output

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = [PAD, UNK, CLS, SEP, MASK]
register_output("tokenizer", MODEL_FILES - {"config.json", "model.safetensors"})


@dataclass(frozen=True)
class SpecialIds:
    pad: int
    unk: int
    cls: int
    sep: int
    mask: int

    def as_set(self) -> set[int]:
        return {self.pad, self.unk, self.cls, self.sep, self.mask}


def special_ids(tok: Tokenizer) -> SpecialIds:
    """Ids of [PAD] [UNK] [CLS] [SEP] [MASK]; a vocabulary that lacks one is a UserError."""
    ids = {}
    for t in SPECIAL_TOKENS:
        i = tok.token_to_id(t)
        if i is None:
            raise UserError(f"the vocabulary has no {t} token")
        ids[t] = i
    return SpecialIds(ids[PAD], ids[UNK], ids[CLS], ids[SEP], ids[MASK])


def model_kind(tok: Tokenizer) -> str:
    """'wordpiece' or 'wordlevel'."""
    return "wordlevel" if isinstance(tok.model, WordLevel) else "wordpiece"


def _register_special_tokens(tok: Tokenizer) -> None:
    """[PAD] [UNK] [CLS] [SEP] [MASK] as special added tokens: "[MASK]" typed in a text stays one token,
    untouched by lower-casing (as in transformers' BertTokenizer)."""
    present = [t for t in SPECIAL_TOKENS if tok.token_to_id(t) is not None]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in present])


def _configure(tok: Tokenizer, lowercase: bool, strip_accents: bool | None = None) -> Tokenizer:
    """BERT normaliser, pre-tokeniser, decoder and [CLS]/[SEP] post-processor."""
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=strip_accents, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    if isinstance(tok.model, WordPiece):
        tok.decoder = decoders.WordPiece(prefix="##")
    else:
        tok.decoder = None
    _register_special_tokens(tok)
    _add_post_processor(tok)
    return tok


def _add_post_processor(tok: Tokenizer) -> None:
    cls, sep = tok.token_to_id(CLS), tok.token_to_id(SEP)
    if cls is None or sep is None:
        raise UserError("the vocabulary has no [CLS] or [SEP] token")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{CLS}:0 $A:0 {SEP}:0",
        pair=f"{CLS}:0 $A:0 {SEP}:0 $B:1 {SEP}:1",
        special_tokens=[(CLS, cls), (SEP, sep)],
    )


def from_vocab(vocab: dict[str, int] | list[str], kind: str = "wordpiece", lowercase: bool = True,
               strip_accents: bool | None = None) -> Tokenizer:
    """A BERT tokenizer over a given vocabulary (a token->id dict, or tokens in id order)."""
    if isinstance(vocab, list):
        vocab = {t: i for i, t in enumerate(vocab)}
    if UNK not in vocab:
        raise UserError("the vocabulary has no [UNK] token")
    if kind == "wordpiece":
        model = WordPiece(vocab, unk_token=UNK, continuing_subword_prefix="##", max_input_chars_per_word=100)
    elif kind == "wordlevel":
        model = WordLevel(vocab, unk_token=UNK)
    else:
        raise UserError(f"unknown tokenizer model {kind!r}; expected wordpiece or wordlevel")
    return _configure(Tokenizer(model), lowercase, strip_accents)


def _trainer(kind: str, vocab_size: int, min_frequency: int, special_tokens: list[str], show_progress: bool):
    if kind == "wordpiece":
        return trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                         special_tokens=special_tokens, continuing_subword_prefix="##",
                                         limit_alphabet=1000, show_progress=show_progress)
    return trainers.WordLevelTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                     special_tokens=special_tokens, show_progress=show_progress)


def _learn(texts: Iterable[str], kind: str, lowercase: bool, trainer, length: int | None) -> dict[str, int]:
    model = WordPiece(unk_token=UNK, continuing_subword_prefix="##", max_input_chars_per_word=100) \
        if kind == "wordpiece" else WordLevel(unk_token=UNK)
    tok = Tokenizer(model)
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(iter(texts), trainer=trainer, length=length)
    return tok.get_vocab()


def train_vocabulary(
    texts: Iterable[str],
    vocab_size: int,
    kind: str = "wordpiece",
    lowercase: bool = True,
    min_frequency: int = 2,
    length: int | None = None,
    show_progress: bool = False,
) -> Tokenizer:
    """Learn a vocabulary of ``vocab_size`` tokens (special tokens included, at ids 0-4), or of more where the
    text's characters and their ``##`` continuations are more (warned), the same one for the same text in every
    process.

    ``texts`` is read twice for WordPiece: give a list or a re-iterable (:func:`bertforge.corpus.iter_texts`); a
    one-shot iterator is held in memory.  The ``tokenizers`` WordPiece trainer numbers the ``##`` continuations
    of the alphabet as a hash map iterates (differently in every process), and breaks ties between pairs of
    equal count by those numbers, so the same text could give another vocabulary.  A first pass without merges
    finds the alphabet and its continuations; the second pass is given them, sorted, ahead of its merges (as
    special tokens of the trainer only: the tokenizer is rebuilt from the learned vocabulary), so every tie is
    broken the same way.  (One tie is left to the library: which of equally rare characters a corpus of over
    1,000 distinct ones drops from its alphabet.)"""
    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise UserError(f"vocab size {vocab_size} is too small")
    if kind not in ("wordpiece", "wordlevel"):
        raise UserError(f"unknown tokenizer model {kind!r}; expected wordpiece or wordlevel")
    if kind == "wordpiece" and iter(texts) is texts:
        texts = list(texts)
    specials = SPECIAL_TOKENS
    if kind == "wordpiece":
        alphabet = _learn(texts, kind, lowercase, _trainer(kind, 1, min_frequency, specials, show_progress), length)
        specials = SPECIAL_TOKENS + sorted(t for t in alphabet if t not in SPECIAL_TOKENS)
    learned = _learn(texts, kind, lowercase, _trainer(kind, vocab_size, min_frequency, specials, show_progress),
                     length)
    if len(learned) <= len(SPECIAL_TOKENS):
        raise UserError("no vocabulary could be learned: the training text is empty")
    if len(learned) > vocab_size:  # (WordPiece keeps every character of the text, and its ## continuation)
        logging.getLogger("bertforge").warning(
            "the vocabulary holds %d tokens, more than the %d asked: the text's characters alone (with their ## "
            "continuations) are that many", len(learned), vocab_size)
    # Rebuild from the learned vocabulary so that a trained and a loaded tokenizer are configured alike: the
    # special tokens first, then the others sorted (the trainers order tokens of equal frequency as a hash map
    # iterates), so that the same text gives the same vocabulary file.
    return from_vocab(SPECIAL_TOKENS + sorted(t for t in learned if t not in SPECIAL_TOKENS), kind, lowercase)


def vocab_tokens(tok: Tokenizer) -> list[str]:
    """The vocabulary in id order (the lines of vocab.txt)."""
    vocab = tok.get_vocab(with_added_tokens=True)
    out = [""] * (max(vocab.values()) + 1)
    for t, i in vocab.items():
        out[i] = t
    return out


def is_lowercase(tok: Tokenizer) -> bool:
    state = json.loads(tok.to_str()).get("normalizer") or {}
    if state.get("type") == "Sequence":
        return any(n.get("type") == "Lowercase" or n.get("lowercase") for n in state.get("normalizers", []))
    return bool(state.get("lowercase") or state.get("type") == "Lowercase")


def check_vocab_fits(tok: Tokenizer, vocab_size: int, where: str) -> None:
    """A tokenizer and a model meet: their vocabularies must be the same size, or predictions would name ids
    the tokenizer does not know (or never reach tokens the model has)."""
    n = tok.get_vocab_size(with_added_tokens=True)
    if n != vocab_size:
        raise UserError(f"{where}: the tokenizer has {n} tokens but the model's vocabulary holds {vocab_size}; "
                        "they do not belong together")


def copy_of(tok: Tokenizer, truncation: int | None = None) -> Tokenizer:
    """A copy of ``tok`` that pads nothing and cuts each input (a pair's longest segment first) at ``truncation``
    tokens, or nowhere (None)."""
    t = Tokenizer.from_str(tok.to_str())
    t.no_padding()
    if truncation is None:
        t.no_truncation()
    else:
        t.enable_truncation(truncation, strategy="longest_first")
    return t


def save_tokenizer(tok: Tokenizer, folder: str, model_max_length: int = 512) -> None:
    """Write the four tokenizer files into ``folder``."""
    os.makedirs(folder, exist_ok=True)
    tok = copy_of(tok)  # (never save padding or truncation settings)
    write_file(os.path.join(folder, "tokenizer.json"), lambda f: f.write(tok.to_str(pretty=True).encode()))
    with open(os.path.join(folder, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(vocab_tokens(tok)) + "\n")
    kind = model_kind(tok)
    lower = is_lowercase(tok)
    specials = {"unk_token": UNK, "sep_token": SEP, "pad_token": PAD, "cls_token": CLS, "mask_token": MASK}
    cfg = {
        # WordPiece loads as transformers' BertTokenizer(Fast); a word-level vocabulary through the generic
        # fast tokenizer, which reads tokenizer.json as it is.
        "tokenizer_class": "BertTokenizer" if kind == "wordpiece" else "PreTrainedTokenizerFast",
        "do_lower_case": lower,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "bertforge_tokenizer_model": kind,
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
        **specials,
    }
    for name, content in (("tokenizer_config.json", cfg), ("special_tokens_map.json", specials)):
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            json.dump(content, f, indent=2)
            f.write("\n")


def _read_vocab_txt(path: str) -> list[str]:
    tokens = [line.rstrip("\r") for line in read_text(path, "vocabulary file").split("\n")]
    while tokens and tokens[-1] == "":
        tokens.pop()
    if not tokens:
        raise UserError(f"vocabulary file is empty: {path}")
    return tokens


def load_tokenizer(path: str) -> Tokenizer:
    """A ready BERT tokenizer from a model/tokenizer directory, a ``tokenizer.json`` or a ``vocab.txt``."""
    path = os.fspath(require_type(path, (str, os.PathLike), "path"))
    if not os.path.exists(path):
        raise UserError(f"tokenizer not found: {path}")
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    cfg_path = os.path.join(folder, "tokenizer_config.json")
    cfg = read_json_object(cfg_path, "tokenizer_config.json") if os.path.isfile(cfg_path) else {}
    tok_json = os.path.join(folder, "tokenizer.json") if os.path.isdir(path) else (
        path if path.endswith(".json") else None)
    vocab_txt = os.path.join(folder, "vocab.txt") if os.path.isdir(path) else (
        path if not path.endswith(".json") else None)
    if tok_json and os.path.isfile(tok_json):
        try:
            tok = Tokenizer.from_file(tok_json)
        except Exception as e:  # tokenizers raises a bare Exception on malformed files
            raise UserError(f"cannot read {tok_json}: {e}") from None
        tok.no_padding()
        tok.no_truncation()
        _register_special_tokens(tok)
        if tok.post_processor is None:
            _add_post_processor(tok)
    elif vocab_txt and os.path.isfile(vocab_txt):
        lower = bool(cfg.get("do_lower_case", True))
        strip = cfg.get("strip_accents")
        kind = cfg.get("bertforge_tokenizer_model", "wordpiece")
        tok = from_vocab(_unrepeated(_read_vocab_txt(vocab_txt), vocab_txt), kind, lowercase=lower, strip_accents=strip)
    else:
        raise UserError(f"no tokenizer in {path}: expected tokenizer.json or vocab.txt")
    special_ids(tok)  # fail early on a vocabulary without BERT's special tokens
    _check_ids(tok, tok_json if tok_json and os.path.isfile(tok_json) else vocab_txt)
    return tok


def _unrepeated(lines: list[str], path: str) -> list[str]:
    """vocab.txt's tokens, a repeated line's first place named ``[unused-repeat-ID]``: a token's id is its last
    line's, as transformers reads it (some published vocabularies repeat a line), and every id keeps a token,
    so that the tokenizer saved from it (tokenizer.json, vocab.txt) reads back as the same vocabulary."""
    last = {t: i for i, t in enumerate(lines)}
    out = list(lines)
    for i, t in enumerate(lines):
        if last[t] != i:
            logging.getLogger("bertforge").warning("%s lists %s twice (lines %d and %d): id %d is read as no token, "
                                                   "as in transformers", path, shown(t), i + 1, last[t] + 1, i)
            out[i] = f"[unused-repeat-{i}]"
    return out


def _check_ids(tok: Tokenizer, path: str) -> None:
    """A BERT vocabulary's ids are 0 ... n-1, one token each (vocab.txt's lines): an id without a token, or a token
    beyond the n rows of the model, would be an embedding row that no token or no row has."""
    ids = sorted(tok.get_vocab(with_added_tokens=True).values())
    if ids == list(range(len(ids))):
        return
    gap = next(i for i, j in enumerate(ids) if i != j)
    raise UserError(f"{path}: the vocabulary's ids are not 0 to {len(ids) - 1}, one token each (no token has id {gap}, "
                    f"the largest is {ids[-1]})")


def encode_batch(tok: Tokenizer, texts: list[str], add_special_tokens: bool = False) -> list[list[int]]:
    """Token ids of many texts at once, in parallel on all cores (the tokenizers library's thread pool)."""
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=add_special_tokens)]


def train_to_folder(inputs: list[str], out: str, vocab_size: int, kind: str = "wordpiece", lowercase: bool = True,
                    min_frequency: int = 2, text_field: str = "text", doc_separator: str = "file",
                    overwrite: bool = False, progress: bool = False) -> Tokenizer:
    """``bertforge tokenizer train``: a vocabulary trained on the texts of ``inputs``, written to the folder
    ``out`` (under the rules for outputs, :class:`~bertforge.outputs.Output`)."""
    from .corpus import expand_paths, iter_texts

    output = Output(out, "tokenizer", overwrite, inputs=inputs)
    output.check()
    expand_paths(inputs)  # every input exists, before any work
    with output:
        tok = train_vocabulary(iter_texts(inputs, text_field, doc_separator), vocab_size, kind=kind,
                               lowercase=lowercase, min_frequency=min_frequency, show_progress=progress)
        with output.atomic() as tmp:
            save_tokenizer(tok, tmp)
    return tok
