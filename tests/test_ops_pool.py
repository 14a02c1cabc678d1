"""refcg.pool2d (nn.max_pool2d, cast-int32 nn.avg_pool2d / nn.global_avg_pool2d) against TVM-only."""
import pytest
from tvm import relay

from models import module, nchw_or_nhwc
from test_ops_common import Cases, reason_for


def avg(x, pool, **attrs):
    y = pool(relay.cast(x, "int32"), **attrs)
    return relay.cast(y, x.type_annotation.dtype)


SWEEP = [
    # pool, layout, dtype, (c, h, w), attributes
    ("max", "NCHW", "int8", (3, 9, 9), dict(pool_size=(3, 3), strides=(2, 2), padding=(1, 1))),
    ("max", "NHWC", "uint8", (4, 7, 8), dict(pool_size=(2, 2), strides=(2, 2), ceil_mode=True)),
    ("max", "NCHW", "int8", (2, 8, 7), dict(pool_size=(2, 3), dilation=(2, 1), padding=(1, 0, 2, 1))),
    ("avg", "NCHW", "int8", (3, 8, 8), dict(pool_size=(3, 3), padding=(1, 1), count_include_pad=False)),
    ("avg", "NHWC", "uint8", (5, 9, 7), dict(pool_size=(3, 3), strides=(2, 2), padding=(1, 1),
                                            count_include_pad=True, ceil_mode=True)),
    ("avg", "NCHW", "int8", (2, 6, 6), dict(pool_size=(2, 2), strides=(2, 2))),
    ("avg", "NHWC", "int8", (3, 9, 9), dict(pool_size=(3, 2), strides=(1, 2), dilation=(2, 1), padding=(2, 1),
                                           ceil_mode=True)),
    # Inception-v3 (issue 19): 3x3 stride-1 pad-1 averages, 3x3 stride-2 max pools on odd sizes
    ("avg", "NCHW", "uint8", (16, 35, 35), dict(pool_size=(3, 3), padding=(1, 1), count_include_pad=True)),
    ("avg", "NCHW", "uint8", (8, 17, 17), dict(pool_size=(3, 3), padding=(1, 1, 1, 1), count_include_pad=True)),
    ("max", "NCHW", "uint8", (4, 147, 147), dict(pool_size=(3, 3), strides=(2, 2))),
    ("max", "NCHW", "uint8", (8, 71, 71), dict(pool_size=(3, 3), strides=(2, 2))),
    ("max", "NHWC", "uint8", (8, 35, 35), dict(pool_size=(3, 3), strides=(2, 2))),
    ("global", "NCHW", "int8", (6, 5, 7), {}),
    ("global", "NHWC", "uint8", (4, 3, 3), {}),
]
POOLS = {"max": relay.nn.max_pool2d, "avg": relay.nn.avg_pool2d, "global": relay.nn.global_avg_pool2d}


def test_pool_matches_tvm(tmp_path, rng):
    cases = Cases()
    for kind, layout, dtype, (c, h, w), attrs in SWEEP:
        x = cases.var(nchw_or_nhwc(layout, 1, c, h, w), dtype, rng)
        if kind == "max":
            cases.add(relay.nn.max_pool2d(x, layout=layout, **attrs))
        else:
            cases.add(avg(x, POOLS[kind], layout=layout, **attrs))
    cases.compare(tmp_path)


@pytest.mark.parametrize("dtype", ["int16", "float32"])
def test_avg_pool_not_in_int32_stays_in_tvm(dtype):
    x = relay.var("x", shape=(1, 2, 4, 4), dtype="int8")
    y = relay.cast(relay.nn.avg_pool2d(relay.cast(x, dtype), pool_size=(2, 2)), "int8")
    # the integer casts around it may run in refcg (refcg.copy)
    assert f"computed in {dtype}, not int32" in reason_for(module([x], y), "nn.avg_pool2d")
