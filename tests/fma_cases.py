"""float32 requantize rounding boundaries: accumulators where one rounding of x * m + addend (an FMA
target: fma) and two (multiply, then add) give different integers, for UPWARD and TONEAREST.

Found by scanning every accumulator of the int8 output window (products within ~2^-17 of .5 in one
form and not in the other); scales are stored as float32 bit patterns because printed to a few
digits they no longer land on the boundary. m = float32(float64(s_in) / float64(s_out)) as TVM.
"""
import numpy as np


def f32(bits: int) -> np.float32:
    return np.uint32(bits).view(np.float32)


S_OUT = 1019265210  # 0.0235294 (MobileNetV2 block_1_expand's output scale)

# per-channel: output zp -> [(s_in bits, boundary acc UPWARD, boundary acc TONEAREST)] per channel
PER_CHANNEL = {
    -128: [(931812382, 179074, 216173), (926756211, 286922, 286922), (921680420, 439668, 347453),
           (910646564, 431659, 67323), (924144629, 368777, 241886), (924641474, 260389, 245294),
           (909961352, 664518, 104484), (910237045, 412920, 347507)],
    5: [(919365528, -75319, 233682), (916267018, 319072, 319072), (931761683, 86812, 86812),
        (919150596, -264971, 233567), (918047708, -563339, -559055), (916418478, 309495, 309495),
        (914573820, -405916, -796798), (909469766, -1144621, -178439)],
}

# per-tensor: one s_in, output zp -> rounding -> boundary accs
PER_TENSOR_SCALE = 899593020
PER_TENSOR = {
    -128: {"UPWARD": [805932, 1303421, 1482517, 2159102, 2338198, 2696390, 3014783, 4945040],
           "TONEAREST": [228845, 1084526, 1442718, 2298399, 2477495, 3193879, 3910263, 4945040]},
    5: {"UPWARD": [-2616792, 89548], "TONEAREST": [-1303421, 89548]},
}

# qnn.mul: (lhs, rhs, output) scale bits, zero points 0, 0, -128: 121 * 117 = 14157 is on a boundary
MUL_SCALES = (1019911106, 1033082715, 1043765993)
MUL_PAIR = (121, 117)
MUL_ZP = -128

# qnn.add: (output zp, rounding) -> (lhs scale bits, output scale bits, boundary acc); lhs zp 3
ADD_ZP_LHS = 3
ADD = {
    (-128, "UPWARD"): (1031954750, 1037179848, -112),
    (-128, "TONEAREST"): (1032268733, 1034866357, -86),
    (5, "UPWARD"): (1036620400, 1044292174, -122),
    (5, "TONEAREST"): (1026574855, 1033669496, 111),
}


def per_channel_scales(zp: int) -> np.ndarray:
    return np.array([f32(bits) for bits, _, _ in PER_CHANNEL[zp]], np.float32)


def per_channel_accs(zp: int, rounding: str) -> np.ndarray:
    column = 1 if rounding == "UPWARD" else 2
    return np.array([case[column] for case in PER_CHANNEL[zp]], np.int32)
