"""make demo: a quantized MobileNetV2-style ONNX model, TVM-only vs refcg vs ONNX Runtime.

The float model is built in code (fixed seed), quantized by ONNX Runtime's ``quantize_static``
(QDQ, per-channel int8 weights, int8 activations), imported with TVM's ONNX frontend, then
built TVM-only and with refcg. Prints the offload report, the max differences and the speedup;
exits 1 unless refcg matches TVM-only bit for bit. Run from the repository root:
``python -m tools.demo [--size 96] [--save m.onnx]``.
"""
import argparse
import logging
import os
import sys
import tempfile

os.environ.setdefault("TOPHUB_LOCATION", "NONE")
os.environ.setdefault("TVM_NUM_THREADS", "1")  # one core each, like ONNX Runtime below

from examples import onnx_models  # noqa: E402
from refcodegen import cli, runner  # noqa: E402
from refcodegen.frontends import load_model  # noqa: E402


def main() -> int:
    logging.getLogger("autotvm").setLevel(logging.ERROR)  # "operators have not been tuned": expected
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=96, help="input height and width (default 96)")
    parser.add_argument("--save", metavar="PATH.onnx",
                        help="keep the quantized model (then: refcg report PATH.onnx, refcg bench PATH.onnx)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.save or os.path.join(tmp, "mobilenet_v2_int8.onnx")
        with runner.progress("quantizing the MobileNetV2-style model with ONNX Runtime"):
            onnx_models.quantize(onnx_models.mobilenet_v2(size=args.size, classes=100), path, fmt="qdq",
                                 per_channel=True)
        model = load_model(path)
        (name, (shape, dtype)), = model.inputs.items()
        print(f"model: MobileNetV2-style, ONNX QDQ per-channel int8, input {name} {dtype}{list(shape)}, "
              f"target 'llvm', TVM threads {os.environ['TVM_NUM_THREADS']}\n")
        results, report = cli.bench(model, "llvm", path)
    print(f"\n{report}\n")
    (tvm_out, tvm_ms), (refcg_out, refcg_ms) = results["TVM-only"], results["refcg"]
    exact = runner.max_abs_diff(tvm_out, refcg_out)
    print(f"max |refcg - TVM-only|     = {exact:g}  ({'bit-exact' if exact == 0 else 'MISMATCH'})")
    print(f"max |refcg - ONNX Runtime| = {runner.max_abs_diff(results['ONNX Runtime'][0], refcg_out):.4g}"
          "  (different rounding; reported, not required)")
    print(f"QNN ops offloaded: {report.qnn_fraction():.1%}; "
          f"latency TVM-only {tvm_ms:.2f} ms, refcg {refcg_ms:.2f} ms: speedup {tvm_ms / refcg_ms:.2f}x")
    degenerate = runner.degenerate(refcg_out)  # a constant output would make "bit-exact" vacuous
    if degenerate:
        print(f"DEGENERATE: {degenerate}")
    return 0 if exact == 0 and degenerate is None else 1


if __name__ == "__main__":
    sys.exit(main())
