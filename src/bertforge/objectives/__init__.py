"""Pretraining objectives as plug-ins.

An objective (:class:`~bertforge.objectives.base.PretrainingObjective`) is the module the engine trains: it
builds its model, computes the loss of a micro-batch, says what a step adds to the log, evaluates, saves
its outputs, counts its FLOPs and describes itself on the model card.  The pretraining loop
(:mod:`bertforge.pretrain`) names none of them; it asks :func:`objective_class` for the one a run chose.

* ``mlm`` (:mod:`.mlm`): masked language modelling, with next sentence prediction when asked (BERT's).
* ``electra`` (:mod:`.electra`): ELECTRA's replaced-token detection.
"""

from __future__ import annotations

from .base import PretrainingObjective
from .electra import Electra
from .mlm import MaskedLM

OBJECTIVES: dict[str, type[PretrainingObjective]] = {"mlm": MaskedLM, "electra": Electra}


def objective_class(name: str) -> type[PretrainingObjective]:
    return OBJECTIVES[name]


def masked_lm_class(path: str):
    """The class that loads the masked LM in model directory ``path``: the objective whose output it is
    (ELECTRA's generator directory) says so; otherwise BERT's."""
    for objective in OBJECTIVES.values():
        cls = objective.masked_lm_class(path)
        if cls is not None:
            return cls
    from ..model import BertForMaskedLM

    return BertForMaskedLM


__all__ = ["OBJECTIVES", "Electra", "MaskedLM", "PretrainingObjective", "masked_lm_class", "objective_class"]
