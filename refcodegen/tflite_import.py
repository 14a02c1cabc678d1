"""TFLite flatbuffers into Relay: TVM 0.19's ``from_tflite`` with the fixes today's TensorFlow needs.

- FULLY_CONNECTED with per-channel weight scales (what TF >= 2.18 writes by default for dense
  layers): TVM 0.19 accepts per-tensor only (``AssertionError: Expr is not a constant scalar``);
  ``RefcgOperatorConverter`` lowers it to a ``qnn.dense`` with a vector ``kernel_scale`` and a
  per-channel ``qnn.requantize``, the same form TVM gives per-channel convs.
- Anything else the importer rejects raises a ``RefcgError`` naming the TFLite op, its output
  tensor and a converter setting that gives an importable model.
Needs the ``tflite`` extra (the flatbuffer bindings TVM's importer reads).
"""
from __future__ import annotations

import tvm
from tvm import relay
from tvm.relay.frontend.tflite import OperatorConverter, get_tensor_name

from .errors import RefcgError

# The converter settings that give models TVM 0.19 imports (README "TFLite models").
FULL_INT8_HINT = ("convert full-integer: optimizations=[tf.lite.Optimize.DEFAULT], a representative_dataset, "
                  "target_spec.supported_ops=[tf.lite.OpsSet.TFLITE_BUILTINS_INT8], "
                  "inference_input_type/inference_output_type tf.int8 (or tf.uint8)")
# Op-specific ways out, where a converter option changes how TF writes the op.
OP_HINTS = {
    "FULLY_CONNECTED": "or convert with converter._experimental_disable_per_channel_quantization_for_dense_layers"
                       " = True (per-tensor dense weights)",
}


def hint(op_code: str) -> str:
    return f"{FULL_INT8_HINT}{'; ' + OP_HINTS[op_code] if op_code in OP_HINTS else ''}"


class RefcgOperatorConverter(OperatorConverter):
    """TVM's TFLite operator converter, plus per-channel FULLY_CONNECTED and errors naming the op."""

    def __init__(self, model, subgraph, exp_tab):
        super().__init__(model, subgraph, exp_tab)
        # FULLY_CONNECTED's entry is already the bound override below
        self.convert_map = {name: self._named(name, convert) for name, convert in self.convert_map.items()}

    def _named(self, op_code: str, convert):
        """Wrap one converter so a failure names the TFLite op and its output tensor."""
        def run(op):
            try:
                return convert(op)
            except RefcgError:
                raise
            except Exception as err:  # TVM's importer asserts; say which op and what works instead
                outputs = ", ".join(get_tensor_name(self.subgraph, int(i)) for i in op.OutputsAsNumpy())
                reason = f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''}"
                raise RefcgError(f"TFLite {op_code}", outputs,
                                 f"TVM 0.19's importer cannot import it ({reason}); {hint(op_code)}") from err
        return run

    def check_unsupported_ops(self):
        try:
            super().check_unsupported_ops()
        except tvm.error.OpNotImplemented as err:
            raise RefcgError("TFLite model", "operators", f"{str(err).strip()} ({FULL_INT8_HINT})") from err

    def convert_fully_connected(self, op):
        input_tensor, weight_tensor = self.get_input_tensors(op)[:2]
        weight_scale = weight_tensor.qnn_params["scale"].data.numpy() if weight_tensor.qnn_params else None
        if weight_scale is None or weight_scale.ndim == 0:
            return super().convert_fully_connected(op)
        return self._per_channel_fully_connected(op, input_tensor, weight_tensor, weight_scale)

    def _per_channel_fully_connected(self, op, input_tensor, weight_tensor, weight_scale):
        """qnn.dense (vector kernel_scale) + bias + per-channel requantize + fused activation.

        TVM's per-tensor path with the scales kept as vectors: int32 accumulation, int64 for 16x8
        models (int16 activations), as ``convert_fully_connected`` does.
        """
        from tflite.FullyConnectedOptions import FullyConnectedOptions

        tensors = self.get_input_tensors(op)
        output_tensor = self.get_output_tensors(op)[0]
        out_dtype = self.get_tensor_type_str(output_tensor.tensor.Type())
        options = FullyConnectedOptions()
        options.Init(op.BuiltinOptions().Bytes, op.BuiltinOptions().Pos)
        units, depth = (int(d) for d in self.get_tensor_shape(weight_tensor))
        if out_dtype not in ("int8", "uint8", "int16") or not output_tensor.qnn_params:
            raise RefcgError("TFLite FULLY_CONNECTED", get_tensor_name(self.subgraph, output_tensor.tensor_idx),
                             f"per-channel weights with a {out_dtype} output are not supported; {hint('FULLY_CONNECTED')}")
        data = relay.reshape(self.get_tensor_expr(input_tensor), (-1, depth))
        input_scale = float(input_tensor.qnn_params["scale"].data.numpy())
        out = relay.qnn.op.dense(
            data, self.get_tensor_expr(weight_tensor),
            input_zero_point=input_tensor.qnn_params["zero_point"],
            kernel_zero_point=weight_tensor.qnn_params["zero_point"],
            input_scale=input_tensor.qnn_params["scale"],
            kernel_scale=relay.const(weight_scale.astype("float32")),
            units=units, out_dtype="int64" if out_dtype == "int16" else "int32")  # 16x8: as TVM's importer
        if len(tensors) == 3 and tensors[2].tensor_idx != -1:
            out = relay.nn.bias_add(out, self.get_tensor_expr(tensors[2]))
        out = relay.qnn.op.requantize(
            out, input_scale=relay.const((input_scale * weight_scale).astype("float32")),
            input_zero_point=relay.const(0, "int32"),
            output_scale=output_tensor.qnn_params["scale"],
            output_zero_point=output_tensor.qnn_params["zero_point"], out_dtype=out_dtype, axis=1)
        out = self.convert_qnn_fused_activation_function(
            out, options.FusedActivationFunction(),
            float(output_tensor.qnn_params["scale"].data.numpy()),
            int(output_tensor.qnn_params["zero_point"].data.numpy()), out_dtype)
        if options.KeepNumDims():
            in_shape = tuple(int(d) for d in self.get_tensor_shape(input_tensor))
            out = relay.reshape(out, in_shape[:-1] + (units,))
        return out


def read_model(path: str):
    """The flatbuffer root (``tflite.Model``) of a ``.tflite`` file."""
    with open(path, "rb") as f:
        buf = f.read()
    if buf[4:8] != b"TFL3":
        raise RefcgError("model", path, "not a TFLite flatbuffer (no TFL3 file identifier)")
    try:
        import tflite
    except ImportError:
        raise RefcgError("model", "tflite", "not installed: pip install 'refcodegen[tflite]'") from None
    model = tflite.Model.GetRootAsModel(buf, 0)
    if model.SubgraphsLength() != 1:
        raise RefcgError("TFLite model", path, f"{model.SubgraphsLength()} subgraphs: TVM imports one "
                         "(control flow such as WHILE/IF does not import)")
    return model


def signature(model) -> tuple[dict, dict]:
    """Input name -> shape and name -> dtype, as the model declares them."""
    from tvm.relay.frontend.tflite import _decode_type

    subgraph = model.Subgraphs(0)
    shapes, dtypes = {}, {}
    for i in subgraph.InputsAsNumpy():
        tensor = subgraph.Tensors(int(i))
        name = get_tensor_name(subgraph, int(i))
        shapes[name] = tuple(int(d) for d in tensor.ShapeAsNumpy())
        dtypes[name] = _decode_type(tensor.Type())
    return shapes, dtypes


def from_tflite(path: str, shapes: dict | None = None):
    """``(mod, params)`` for a ``.tflite`` file; ``shapes`` overrides input shapes (e.g. batch)."""
    model = read_model(path)
    shape_dict, dtype_dict = signature(model)
    for name, shape in (shapes or {}).items():
        if name not in shape_dict:
            raise RefcgError("--input-shape", name, f"no such input (inputs: {', '.join(shape_dict)})")
        shape_dict[name] = tuple(shape)
    for name, shape in shape_dict.items():
        if any(d <= 0 for d in shape):
            raise RefcgError("input", name, f"shape {shape} is not static: give --input-shape {name}:...")
    return relay.frontend.from_tflite(model, shape_dict, dtype_dict, op_converter=RefcgOperatorConverter)

