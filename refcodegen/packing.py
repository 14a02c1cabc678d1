"""Compile-time weight packing: folded constants rearranged into the layouts the C core reads."""
from __future__ import annotations

import numpy as np

# kernel_layout -> axes permutation giving [out_channel][kh][kw][in_channel/groups]
_TO_OHWI = {"OIHW": (0, 2, 3, 1), "HWIO": (3, 0, 1, 2), "OHWI": (0, 1, 2, 3)}


def pack_conv2d_weight(weight: np.ndarray, kernel_layout: str) -> np.ndarray:
    """Weights as ``[O][KH][KW][I/groups]``, contiguous: one output channel's taps in a row."""
    return np.ascontiguousarray(weight.transpose(_TO_OHWI[kernel_layout]))
