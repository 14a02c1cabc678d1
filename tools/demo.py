"""make demo: a quantized ResNet-18-style network, TVM-only vs refcg, bit-exact check and latency."""
import os
import tempfile
import time

os.environ.setdefault("TOPHUB_LOCATION", "NONE")

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relay  # noqa: E402
from tvm.contrib import graph_executor  # noqa: E402

from refcodegen import networks, offload_report, partition_for_refcg  # noqa: E402

TARGET = "llvm"


def build(mod, path):
    start = time.perf_counter()
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=TARGET)
    lib.export_library(path)
    module = graph_executor.GraphModule(tvm.runtime.load_module(path)["default"](tvm.cpu()))
    return module, time.perf_counter() - start


def latency_ms(module) -> float:
    timer = module.module.time_evaluator("run", tvm.cpu(), number=5, repeat=3)
    return min(timer().results) * 1e3


def main():
    mod, name, shape, dtype = networks.resnet18_style(size=96, classes=100)
    data = np.random.default_rng(0).integers(-128, 128, shape).astype(dtype)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"model: ResNet-18-style, int8 NHWC input {shape}, target {TARGET!r}")
        tvm_only, tvm_build = build(mod, os.path.join(tmp, "tvm_only.so"))
        partitioned = partition_for_refcg(mod)
        print(offload_report(partitioned))
        refcg, refcg_build = build(partitioned, os.path.join(tmp, "refcg.so"))
        outputs = []
        for module in (tvm_only, refcg):
            module.set_input(name, data)
            module.run()
            outputs.append(module.get_output(0).numpy().astype(np.int64))
        diff = int(np.abs(outputs[0] - outputs[1]).max())
        t_tvm, t_refcg = latency_ms(tvm_only), latency_ms(refcg)
    print(f"build+export: TVM-only {tvm_build:.1f} s, refcg {refcg_build:.1f} s")
    print(f"max |refcg - TVM-only| = {diff}  ({'bit-exact' if diff == 0 else 'MISMATCH'})")
    print(f"latency: TVM-only {t_tvm:.2f} ms, refcg {t_refcg:.2f} ms, speedup {t_tvm / t_refcg:.2f}x")
    if diff:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
