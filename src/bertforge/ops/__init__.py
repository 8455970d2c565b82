"""The fast paths behind :mod:`bertforge.model`, each a file with an equality test against the plain path.

* :mod:`.linear`: ``F.linear`` through oneDNN's fp32 kernel on the CPU.
* :mod:`.dropout`: dropout with 16-bit random masks on the CPU.
* :mod:`.padding`: running token-wise layers on real tokens only; row gathers with a cheap backward.
* :mod:`.attention`: the attention kernels (SDPA, variable-length over nested tensors on CUDA, own maths
  with dropout on the CPU, over the padded layout or one sequence at a time) and the one function that picks
  among them.
* :mod:`.cross_entropy`: the masked-LM loss fused with its vocabulary projection, and its reused buffer.

The model reads as the paper's maths; what these change (and do not) is listed in the docstring at the
top of :mod:`bertforge.model`.
"""

from .attention import attend, row_attention, self_attention
from .cross_entropy import LogitBuffer, linear_cross_entropy_sum
from .dropout import Dropout, dropout
from .linear import Linear, linear
from .padding import Padding, gather_rows

__all__ = [
    "Dropout",
    "Linear",
    "LogitBuffer",
    "Padding",
    "attend",
    "dropout",
    "gather_rows",
    "linear",
    "linear_cross_entropy_sum",
    "row_attention",
    "self_attention",
]
