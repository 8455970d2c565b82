"""The fast paths behind :mod:`bertforge.models.bert`, each a file with an equality test against the plain path.

* :mod:`.layout`: where a batch's real tokens are (token-wise layers run on them only), its dropout keys,
  row selections, and the one place that asks whether ``torch.compile`` traces; row gathers with a cheap
  backward.
* :mod:`.linear`: ``F.linear`` through oneDNN's fp32 kernel on the CPU.
* :mod:`.dropout`: dropout with 16-bit random masks on the CPU, and masks keyed by sequence.
* :mod:`.attention`: the attention kernels (SDPA, variable-length over nested tensors on CUDA, own maths
  with dropout on the CPU, over the padded layout or one sequence at a time) and the one function that picks
  among them.
* :mod:`.cross_entropy`: the masked-LM loss fused with its vocabulary projection, and its reused buffer.
* :mod:`.rows`: the pretraining step's fast path (the last layer only at the rows that reach the loss).

The model reads as the paper's maths; what these change (and do not) is listed in the docstring at the
top of :mod:`bertforge.models.bert`.
"""

from .attention import self_attention
from .cross_entropy import head_buffer, linear_cross_entropy_sum
from .dropout import Dropout
from .layout import Layout, exporting, tracing
from .linear import Linear

__all__ = ["Dropout", "Layout", "Linear", "exporting", "head_buffer", "linear_cross_entropy_sum", "self_attention",
           "tracing"]
