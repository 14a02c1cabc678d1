"""refcg.requantize: qnn.requantize (+clip) on its own, per tensor or along any axis; each part is one
refcg_requantize call (concatenate.py writes its inputs' parts with it)."""
from __future__ import annotations

from dataclasses import dataclass

from tvm.relay.dataflow_pattern import is_op, wildcard

from .base import DTYPE_CODE, REQUANTIZE_DTYPES, Buffer, Call, Step, check_tensor, prod, static_shape
from .epilogue import Epilogue, float_conversion_reason, requantize_of, value_bound

NAME = "requantize"
NEON_REQUANTIZE = True


def patterns() -> list:
    # last among the families ending in a requantize: after a conv or dense it belongs to that kernel's epilogue
    return [(requantize_of(wildcard()).optional(lambda x: is_op("clip")(x)), Requantize.parse)]


def part(src: Buffer, axis: int, out_channels: int, offset: int, dst: Buffer, rq) -> dict:
    """One refcg_requantize_params: ``src`` viewed as [outer][channels][inner] around ``axis``, written
    at channel ``offset`` of an output with ``out_channels`` along it (``axis`` of the physical shape)."""
    shape = src.physical_shape
    inner = prod(shape[axis + 1:])
    return {
        "input": src, "outer": prod(shape[:axis]), "channels": shape[axis],
        "inner": inner, "out_outer_stride": out_channels * inner, "out_offset": offset * inner,
        "in_dtype": DTYPE_CODE[src.dtype], "out_dtype": DTYPE_CODE[dst.dtype], "rq": rq,
    }


def step(name: str, parts: list[dict], dst: Buffer) -> Step:
    """Parts write disjoint slabs of the output, one call each."""
    calls = [Call("refcg_requantize", [f"p{i}_params"], [p["input"]], dst) for i, p in enumerate(parts)]
    return Step(name, NAME, [p["input"] for p in parts], dst, {"parts": parts}, calls)


@dataclass
class Requantize:
    epilogue: Epilogue

    @classmethod
    def parse(cls, root) -> "Requantize":
        return cls(Epilogue.parse(root))

    def members(self) -> list:
        return [self.epilogue.requantize]

    def reason(self, ctx) -> str | None:
        req = self.epilogue.requantize
        reason = check_tensor(req.args[0], "requantize input", dtypes=REQUANTIZE_DTYPES)
        if reason:
            return reason
        shape = static_shape(req.args[0])
        axis = int(req.attrs.axis) % len(shape)
        return self.epilogue.reason(shape[axis], axis, len(shape), require_requantize=True) or \
            float_conversion_reason(req, value_bound(req.args[0]), ctx.target)

    def layout_ok(self, src_perms, dst_perm) -> bool:
        """Any layout its input and output share: [outer][channels][inner] around the axis there."""
        return list(src_perms) == [dst_perm]

    def plan(self, name: str, func, srcs, dst, target, ask=None) -> Step:
        src = srcs[0]
        axis = src.physical_axis(int(self.epilogue.requantize.attrs.axis) % len(src.shape))
        rq = self.epilogue.requant(target, ask)
        return step(name, [part(src, axis, src.physical_shape[axis], 0, dst, rq)], dst)


def parse(body) -> Requantize:
    """The parameter object of a composite's body (at plan time, after the scoped fold)."""
    return Requantize.parse(body)
