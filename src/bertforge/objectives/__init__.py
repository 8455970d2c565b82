"""Pretraining objectives as plug-ins.

An objective (:class:`~bertforge.objectives.base.PretrainingObjective`) is the module the engine trains: it
builds its model, computes the loss of a micro-batch, says what a step adds to the log, evaluates, saves
its outputs, counts its FLOPs and describes itself on the model card.  The pretraining loop
(:mod:`bertforge.train.pretrain`) names none of them; it takes the one a run chose from
:data:`OBJECTIVES`, and :func:`bertforge.loading.masked_lm` asks each whether a directory is its masked LM.

* ``mlm`` (:mod:`.mlm`): masked language modelling, with next sentence prediction when asked (BERT's).
* ``electra`` (:mod:`.electra`): ELECTRA's replaced-token detection.
"""

from __future__ import annotations

from .base import PretrainingObjective
from .electra import Electra
from .mlm import MaskedLM

OBJECTIVES: dict[str, type[PretrainingObjective]] = {"mlm": MaskedLM, "electra": Electra}


__all__ = ["OBJECTIVES", "Electra", "MaskedLM", "PretrainingObjective"]
