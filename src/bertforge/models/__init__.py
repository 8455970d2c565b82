"""The models wing: every model family, its config beside its model, and the one registry that the rest of
bertforge asks (:mod:`bertforge.models.registry`).

* :mod:`~bertforge.models.base`: what every family shares (the config.json base, :class:`PreTrainedModel`, the
  output types).
* :mod:`~bertforge.models.bert`: BERT and :class:`BertConfig`; :mod:`~bertforge.models.modernbert`: ModernBERT;
  :mod:`~bertforge.models.electra`: ELECTRA's generator and discriminator over BERT.
* :mod:`~bertforge.models.initialization`: starting values beyond a family's own; :mod:`~bertforge.models.flops`:
  the FLOP count.
"""

from .base import PreTrainedModel
from .bert import (BertConfig, BertForMaskedLM, BertForPreTraining, BertForQuestionAnswering,
                   BertForSequenceClassification, BertForTokenClassification, BertModel)
from .modernbert import (ModernBertConfig, ModernBertForMaskedLM, ModernBertForQuestionAnswering,
                         ModernBertForSequenceClassification, ModernBertForTokenClassification, ModernBertModel)
from .registry import (FAMILIES, OUTPUTS, Family, check_preset, family, family_of, family_of_config, for_folder,
                       head_class, load_config, role_of_config)

__all__ = ["PreTrainedModel", "BertConfig", "BertModel", "BertForPreTraining", "BertForMaskedLM",
           "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering",
           "ModernBertConfig", "ModernBertModel", "ModernBertForMaskedLM", "ModernBertForSequenceClassification",
           "ModernBertForTokenClassification", "ModernBertForQuestionAnswering", "FAMILIES", "Family", "family",
           "family_of", "family_of_config", "for_folder", "head_class", "load_config", "OUTPUTS", "role_of_config",
           "check_preset"]
