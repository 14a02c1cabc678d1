"""``python -m refcodegen.tvmc``: TVM's own command line (tvmc) with refcg as a composite target.

    python -m refcodegen.tvmc compile --target "refcg, llvm" model.tflite -o m.tar
    python -m refcodegen.tvmc run m.tar --fill-mode random --print-top 5   (or plain `tvmc run`)

``register()`` adds refcg to tvmc's composite-target registry (``partition_for_refcg`` as its
pass pipeline) and has tvmc read ``.tflite`` files through refcg's importer (per-channel
FULLY_CONNECTED, errors naming the op); then ``main`` hands over to tvmc. Options go in the target
string: ``--target "refcg -fake_quantization_to_integer=1 -fold_batch_norm=0, llvm"``; without
them QDQ graphs (float convs/dense fed by ``qnn.dequantize``, as tvmc imports ONNX QDQ) get
FakeQuantizationToInteger. A library tvmc built runs without refcg installed (the C is inside it).
"""
from __future__ import annotations

import sys

import tvm
from tvm import relay

from .errors import RefcgError
from .partition import partition_for_refcg

BOOLEAN_OPTIONS = ("fake_quantization_to_integer", "fold_batch_norm")
FLOAT_OPS_OF_QDQ = ("nn.conv2d", "nn.dense", "nn.batch_matmul", "nn.matmul")


def is_qdq(mod) -> bool:
    """Does a float conv/dense/matmul take a ``qnn.dequantize`` result (a QDQ graph)?"""
    found = []

    def visit(node):
        if (isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op) and node.op.name in FLOAT_OPS_OF_QDQ
                and any(isinstance(a, relay.Call) and getattr(a.op, "name", "") == "qnn.dequantize" for a in node.args)):
            found.append(node)

    relay.analysis.post_order_visit(mod["main"], visit)
    return bool(found)


def partition(mod, params=None, mod_name="default", **options):
    """tvmc's pass-pipeline signature around ``partition_for_refcg``; options arrive as strings."""
    del mod_name  # partition_for_refcg names functions after the module tvmc builds
    unknown = set(options) - set(BOOLEAN_OPTIONS)
    if unknown:
        raise RefcgError("tvmc", ", ".join(sorted(unknown)), f"unknown refcg option (known: {', '.join(BOOLEAN_OPTIONS)})")
    flags = {name: str(value).lower() in ("1", "true", "yes") for name, value in options.items()}
    flags.setdefault("fake_quantization_to_integer", is_qdq(relay.transform.InferType()(mod)))
    return partition_for_refcg(mod, params, **flags)


def register():
    """Make tvmc know the ``refcg`` target and import TFLite through refcg (idempotent)."""
    from tvm.driver.tvmc import composite_target, frontends

    from .tflite_import import from_tflite

    composite_target.REGISTERED_CODEGEN["refcg"] = {
        "config_key": None, "pass_default": False, "default_target": None, "pass_pipeline": partition,
    }

    class TFLiteFrontend(frontends.TFLiteFrontend):
        def load(self, path, shape_dict=None, **kwargs):
            return from_tflite(path, shape_dict)

    frontends.ALL_FRONTENDS[:] = [TFLiteFrontend if f.name() == "tflite" else f for f in frontends.ALL_FRONTENDS]


def main(argv=None) -> int:
    register()
    from tvm.driver.tvmc.main import _main

    try:
        return _main(sys.argv[1:] if argv is None else argv) or 0  # tvmc's run returns None
    except RefcgError as err:
        print(f"refcg: error: {err.op}: {err.attribute}: {err.reason}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
