# TEMPORARY (replaced by the model helper's version at merge)
from .model import local_attention_heads_, sinusoidal_positions_  # noqa: F401


def set_dropout(model, p):
    model.set_dropout(p)
