"""Where a run's tokenizer, model config and weights come from: one pure function of what the command was given
and what its output folder holds, decided before anything is read, and one table test of every combination
(tests/train/test_plan.py).

=====================================  ===============  ===============  ==================  ===============
what the run was given / holds         tokenizer        config           weights             starting values
=====================================  ===============  ===============  ==================  ===============
``--resume`` with a checkpoint         the run's own    the run's own    the checkpoint's    no
``--resume`` killed before its first   the run's own*   as a new run     as a new run        as a new run
a prepared ``--data`` folder           the folder's     (below)          (below)             (below)
``--tokenizer``                        that one         (below)          (below)             (below)
``--init`` (no ``--tokenizer``)        --init's         --init's         --init's            no
``--init --add-vocab N``               --init's + N     --init's, grown  --init's, grown     no
``--model-config``                     (above) or new   that file        new                 yes
a preset                               (above) or new   the preset       new                 yes
=====================================  ===============  ===============  ==================  ===============

(*) when it saved one before it was killed; else as a new run.  "new": a vocabulary trained on ``--data``.
"starting values": the recipe's values for a new model (``--position-init``, ``--attention-init``).
Refused: ``--add-vocab`` without ``--init`` or with a prepared corpus (its vocabulary is fixed), and
``--init`` with ``--model-config`` (two architectures).  Fine-tuning is the row of ``--init``: everything
from ``--model``, the weights from the checkpoint on ``--resume``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer

from .. import vocabulary
from ..config import progress_shown
from ..corpus import iter_texts
from ..errors import UserError, shown
from ..loading import check_max_seq_length
from ..models import FAMILIES, family, family_of, load_config
from ..models.initialization import local_attention_heads_, set_dropout, sinusoidal_positions_
from ..objectives import OBJECTIVES
from ..prepared import prepared_settings, tokenizer_fingerprint
from ..shards import is_prepared
from ..tokenizer import check_vocab_fits, load_tokenizer, special_ids, train_vocabulary

log = logging.getLogger("bertforge")


@dataclass(frozen=True)
class Given:
    """What decides a run's start: the flags given, and what the output folder and the inputs hold."""
    resume: bool = False
    checkpointed: bool = False  # the output folder holds a checkpoint that --resume continues from
    saved_tokenizer: bool = False  # the output folder holds the run's tokenizer
    prepared: bool = False  # --data is a prepared corpus (it brings its own tokenizer)
    tokenizer: bool = False
    init: bool = False
    add_vocab: bool = False
    model_config: bool = False


@dataclass(frozen=True)
class StartPlan:
    tokenizer: str  # "out" | "prepared" | "given" | "init" | "trained"
    extend_vocab: bool  # the tokenizer gets --add-vocab's new tokens
    config: str  # "out" | "init" | "model_config" | "preset"
    weights: str  # "checkpoint" | "init" | "new"
    grow: bool  # --init's model grown to the extended vocabulary
    starting_values: bool  # the recipe's values for a new model apply

    @property
    def continued(self) -> bool:
        """Whether the run continues from its checkpoint (everything decided by the run's own folder)."""
        return self.weights == "checkpoint"


def start_plan(g: Given) -> StartPlan:
    """The plan of a run given ``g``; a combination that cannot make sense is a UserError."""
    if g.add_vocab and not g.init:
        raise UserError("--add-vocab extends the vocabulary of the model that --init names; pass --init MODEL")
    if g.init and g.model_config:
        raise UserError("--model-config describes a new model, and --init's has its own config.json; give one of them")
    if g.add_vocab and g.prepared and not g.checkpointed:
        raise UserError("--add-vocab changes the vocabulary, and a prepared corpus is tokenized with its own: give the "
                        "raw text as --data")
    continued = g.resume and g.checkpointed
    if continued or (g.resume and g.saved_tokenizer):
        tokenizer = "out"
    elif g.prepared:
        tokenizer = "prepared"
    elif g.tokenizer:
        tokenizer = "given"
    else:
        tokenizer = "init" if g.init else "trained"
    extend = tokenizer in ("given", "init") and g.add_vocab
    if continued:
        return StartPlan(tokenizer, False, "out", "checkpoint", False, False)
    config = "init" if g.init else "model_config" if g.model_config else "preset"
    weights = "init" if g.init else "new"
    return StartPlan(tokenizer, extend, config, weights, g.add_vocab, weights == "new")


# ------------------------------------------------------------------------------------------------ the family
def resolve_arch(cfg, saved: dict | None) -> None:
    """Set ``cfg.model.arch`` to the run's model family: a resumed run's own (``saved``: its settings), else the
    family --init's or --model-config's config.json names, else --arch (when not given: the family of a preset
    only one family has, else bert).  An --arch that names another family than the model's is refused."""
    mc = cfg.model
    source = mc.init or mc.model_config
    if mc.arch not in (None, *FAMILIES):
        return  # (validation names the choices)
    if saved is not None:
        theirs = (saved.get("model") or {}).get("arch") or "bert"
        where = f"the run in {shown(cfg.out)} trains a {theirs} model"
    elif source and os.path.exists(source):
        theirs = family_of(source).name
        where = (f"{'--init' if mc.init else '--model-config'} {shown(source)} holds a {theirs} model (its "
                 "config.json's model_type)")
    else:
        mc.arch = mc.arch or next((f.name for f in FAMILIES.values() if mc.preset in f.presets), "bert")
        return
    if mc.arch not in (None, theirs):
        raise UserError(f"--arch {mc.arch}: {where}; leave --arch out")
    mc.arch = theirs


# ------------------------------------------------------------------------------------------------ pretraining
def pretraining_plan(cfg, resume: bool, folder) -> StartPlan:
    """The plan of pretraining run ``cfg`` (``folder``: its :class:`~bertforge.train.runfolder.RunFolder`)."""
    m = cfg.model
    return start_plan(Given(resume=resume, checkpointed=resume and bool(folder.checkpoints()),
                            saved_tokenizer=folder.has_tokenizer, prepared=any(is_prepared(p) for p in cfg.data.data),
                            tokenizer=bool(cfg.data.tokenizer), init=bool(m.init), add_vocab=bool(m.add_vocab),
                            model_config=bool(m.model_config)))


def pretraining_tokenizer(cfg, plan: StartPlan, d):
    """The run's tokenizer, as ``plan`` says: the run's own, a prepared corpus's, --tokenizer's, --init's
    (extended by --add-vocab), or a vocabulary trained on the data by rank 0 and sent to the others."""
    dc = cfg.data
    if plan.tokenizer == "out":
        return load_tokenizer(cfg.out)
    if plan.tokenizer == "prepared":
        return _prepared_tokenizer(cfg, next(p for p in dc.data if is_prepared(p)))
    if plan.tokenizer in ("given", "init"):
        tok = load_tokenizer(dc.tokenizer or cfg.model.init)
        if plan.tokenizer == "given" and plan.weights == "init":
            _check_same_vocabulary(tok, cfg)
        return _extended_tokenizer(cfg, tok, d) if plan.extend_vocab else tok
    text = None
    if d.is_main:
        log.info("training a %s vocabulary of %d tokens on the data", dc.tokenizer_model, dc.vocab_size)
        tok = train_vocabulary(iter_texts(dc.data, dc.text_field, dc.doc_separator), dc.vocab_size,
                               kind=dc.tokenizer_model, lowercase=dc.lowercase,
                               show_progress=progress_shown(cfg.impl.progress))
        size = tok.get_vocab_size(with_added_tokens=True)
        if size < dc.vocab_size:
            log.warning("asked for a vocabulary of %d tokens; the corpus gave %d (too little text or too few "
                        "distinct words): the model is built for %d", dc.vocab_size, size, size)
        text = tok.to_str()
    return Tokenizer.from_str(d.broadcast(text))


def _check_same_vocabulary(tok, cfg) -> None:
    """--tokenizer with --init: it must map tokens to the ids of --init's own tokenizer (else each embedding row would
    stand for another token); one the model folder lacks is not checked."""
    try:
        own = load_tokenizer(cfg.model.init)
    except UserError:
        return
    mine, theirs = own.get_vocab(with_added_tokens=True), tok.get_vocab(with_added_tokens=True)
    if len(mine) == len(theirs) and mine != theirs:  # (of another size: the model's config says so, later)
        raise UserError(f"--tokenizer {shown(cfg.data.tokenizer)} maps tokens to other ids than --init "
                        f"{shown(cfg.model.init)}'s own tokenizer, so its embedding rows would stand for other tokens; "
                        "leave --tokenizer out (--init's is used), or give one of the same vocabulary")


def take_prepared_reading(cfg) -> None:
    """A prepared corpus was read once, when it was prepared: a reader flag (--text-field, --doc-separator) that says
    otherwise is refused, and the run records the corpus's own (not a default it never used)."""
    for folder in (p for p in cfg.data.data if is_prepared(p)):
        reading = (prepared_settings(folder) or {}).get("reading")
        if not isinstance(reading, dict):
            continue
        for name, default in (("text_field", "text"), ("doc_separator", "file")):
            given, theirs = getattr(cfg.data, name), reading.get(name, default)
            if given not in (default, theirs):
                raise UserError(f"--{name.replace('_', '-')} {shown(given)}: the prepared corpus {folder} was read "
                                f"with {shown(theirs)} when it was prepared; leave the flag out (or prepare it again)")
            setattr(cfg.data, name, theirs)


def _prepared_tokenizer(cfg, folder: str):
    """A prepared corpus's own tokenizer; a --tokenizer (or --init's) that is another is refused."""
    dc, mc = cfg.data, cfg.model
    tok = load_tokenizer(folder)
    given = dc.tokenizer or mc.init
    if given and tokenizer_fingerprint(load_tokenizer(given)) != tokenizer_fingerprint(tok):
        flag, hint = (("--tokenizer", "leave --tokenizer out (a prepared corpus brings its own)") if dc.tokenizer else
                      ("--init", "continue from a model of the corpus's vocabulary"))
        raise UserError(f"{flag} {shown(given)} has another tokenizer than the prepared corpus {folder}; {hint}, or "
                        "prepare the corpus with its tokenizer")
    log.info("the tokenizer of the prepared corpus %s", folder)
    return tok


def _extended_tokenizer(cfg, tok, d):
    """``--add-vocab N``: ``tok``, the tokenizer of --init's model, with up to N words and subwords of the data
    appended to its vocabulary (:mod:`bertforge.vocabulary`); :func:`pretraining_objective` grows the model."""
    mc, dc = cfg.model, cfg.data
    vocabulary.check_extensible(tok, f"the tokenizer of {shown(dc.tokenizer or mc.init)}")
    check_vocab_fits(tok, load_config(mc.init).vocab_size, _vocab_pair(cfg))
    text = None
    if d.is_main:  # Pretraining.train says what was added, in train.log
        log.info("looking in the data for up to %d words and subwords that the vocabulary lacks", mc.add_vocab)
        new = vocabulary.new_tokens(tok, iter_texts(dc.data, dc.text_field, dc.doc_separator), mc.add_vocab,
                                    show_progress=progress_shown(cfg.impl.progress))
        text = vocabulary.extend_tokenizer(tok, new).to_str()
    return Tokenizer.from_str(d.broadcast(text))


def pretraining_config(cfg, plan: StartPlan, tok):
    """The model's architecture, as ``plan`` says; checked against the tokenizer and the sequence length."""
    source = {"out": cfg.out, "init": cfg.model.init, "model_config": cfg.model.model_config}.get(plan.config)
    cls, size = family(cfg.model.arch).config_class, tok.get_vocab_size(with_added_tokens=True)
    config = cls.preset(cfg.model.preset, vocab_size=size) if source is None else cls.load(source)
    if plan.config in ("preset", "model_config"):  # a new model: the ids of its tokenizer, where its family keeps them
        config.adopt_special_ids(special_ids(tok))
    if plan.grow:  # --init's model, grown to the extended vocabulary by pretraining_objective
        config.vocab_size = tok.get_vocab_size(with_added_tokens=True)
    check_vocab_fits(tok, config.vocab_size, "--tokenizer and the model" if plan.continued else _vocab_pair(cfg))
    check_max_seq_length(config, cfg.data.max_seq_length, source)
    return config


def _vocab_pair(cfg) -> str:
    """Whose tokenizer and model an error about their vocabularies names: --init's own when no --tokenizer is given."""
    if cfg.model.init and not cfg.data.tokenizer:
        return f"--init {shown(cfg.model.init)}: its tokenizer and its model"
    return "--tokenizer and the model"


def pretraining_objective(cfg, plan: StartPlan, config, tok):
    """The run's objective around its model, as ``plan`` says: --init's weights (grown to ``tok``'s vocabulary with
    --add-vocab), or a new model at the recipe's starting values; a continued run's weights come from its
    checkpoint afterwards (:meth:`~bertforge.train.lifecycle.TrainingRun.restore`)."""
    mc = cfg.model
    torch.manual_seed(cfg.train.seed)
    built = load_config(mc.init) if plan.grow else config
    objective = OBJECTIVES[mc.objective].build(cfg, built, plan.weights == "init")
    if plan.grow:
        vocabulary.extend_model(objective.model, tok)
    fam = family(mc.arch)
    if plan.starting_values and mc.position_init == "sinusoidal" and fam.position_table:
        sinusoidal_positions_(objective.model)
        if mc.attention_init == "local":
            local_attention_heads_(objective.model)
    dropout = mc.dropout if mc.dropout is not None else fam.pretraining_dropout
    if dropout is not None:  # pretraining's own (the family's recipe, or --dropout); config.json keeps the model's
        set_dropout(objective.model, dropout)
    return objective
