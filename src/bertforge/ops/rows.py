# TEMPORARY (replaced by the model helper's version at merge)
def pretraining_losses(model, input_ids, attention_mask, token_type_ids, labels, next_sentence_label=None,
                       dropout_keys=None):
    return model.pretraining_loss(input_ids, attention_mask, token_type_ids, labels, next_sentence_label, dropout_keys)
