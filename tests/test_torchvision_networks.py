"""torchvision's quantizable networks, quantized by PyTorch (random weights, post-training static
quantization), imported by TVM's PyTorch frontend, offloaded to refcg: bit-exact with TVM-only."""
import importlib.util

import numpy as np
import pytest

from conftest import compare_with_tvm
from examples import torch_models
from refcodegen import offload_report, runner
from refcodegen.frontends import load_model

# Inception-v3 at 139x139 instead of 299x299: the same ops and kernel shapes (1x7/7x1 and 1x3/3x1 convs
# behind nn.pads, 3x3 stride-1 average pools, 3x3 stride-2 max pools on odd sizes: 67, 31, 15, 7),
# the 17x17 and 8x8 stages at 7x7 and 3x3. TVM-only's build of the 94 convolutions is most of the time
# (233 s CPU, 414 s wall on the loaded 2-core machine): `make test-networks`, not `make test`.
INCEPTION_SIZE = 139


@pytest.mark.network
def test_inception_v3_matches_tvm(tmp_path):
    if importlib.util.find_spec("torchvision") is None:  # the torch extra; make test installs it
        pytest.skip("torchvision is not installed")
    traced, example = torch_models.torchvision_network("inception_v3", INCEPTION_SIZE, seed=0)
    path = str(tmp_path / "inception_v3.pt")
    traced.save(path)
    shape = (1, 3, INCEPTION_SIZE, INCEPTION_SIZE)
    model = load_model(path, {"input": shape})
    outputs = []
    partitioned = compare_with_tvm(runner.prepared(model), {"input": example.numpy()}, tmp_path,
                                   outputs=outputs, fold_batch_norm=False)
    report = offload_report(partitioned)
    distinct = len(np.unique(outputs[0]))  # 73 at the last run
    print(f"\ninception_v3 {shape}: {len(report.partitions)} partitions, {sum(n for op, n in report.offloaded_ops.items() if op.startswith('qnn.'))} "
          f"QNN ops offloaded, {distinct} distinct output values, stayed in TVM: {dict(report.stayed_ops)}")
    assert report.qnn_fraction() == 1.0, str(report)
    assert runner.degenerate(outputs) is None, runner.degenerate(outputs)
