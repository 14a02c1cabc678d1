"""Full-integer TFLite models made in code: Keras networks with random weights, converted by TensorFlow.

``make_tflite(name, ...)`` returns the path of a ``.tflite`` file, cached on disk under a key made of
the model, its settings and the TensorFlow version (``REFCG_CACHE``, default ``~/.cache/refcodegen``).
TensorFlow runs in a child process that executes this file alone (not the refcodegen package, which
imports TVM): TensorFlow and TVM in one process abort (their LLVMs clash, or ``free(): invalid
pointer`` at exit), so the parent never imports TF.

Weights: Keras initializers under a fixed seed, then batch-norm gamma/beta drawn at random and the
moving statistics set from one batch of the calibration data (momentum 0), so activations keep a
sane scale through deep networks and the int8 outputs take many distinct values. Conversion:
``optimizations=[DEFAULT]``, a random representative dataset (uniform [-1, 1], fixed seed),
``TFLITE_BUILTINS_INT8`` (or the 16x8 op set), int8/uint8 (int16 for 16x8) input and output.
Needs the ``tflite-models`` extra (tensorflow-cpu).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
from importlib import metadata

MODELS = ("small_cnn", "two_io", "mobilenet_v2", "mobilenet_v3_small", "resnet50", "efficientnet_b0")
# Keras application arguments per network (weights=None always); alpha only where Keras takes it.
KERAS_APPS = {
    "mobilenet_v2": ("MobileNetV2", {"alpha": 0.35}),
    "mobilenet_v3_small": ("MobileNetV3Small", {"alpha": 0.75, "include_preprocessing": False}),
    "resnet50": ("ResNet50", {}),
    "efficientnet_b0": ("EfficientNetB0", {}),
}


def settings(name: str, size: int = 32, classes: int = 10, seed: int = 0, io_dtype: str = "int8",
             quantization: str = "int8", per_channel_dense: bool = True, calibration: int = 4,
             cut: str | None = None, alpha: float | None = None) -> dict:
    """Every choice that changes the file: the cache key and the child's instructions.

    ``alpha``: width multiplier of the MobileNets (default: the ``KERAS_APPS`` value).
    ``cut``: end a Keras application at this layer (e.g. ``"block_2_add"`` of MobileNetV2) with a
    global average pool and a dense head: the same layer kinds at a fraction of the depth, for tests.

    ``quantization``: ``"int8"`` (TFLITE_BUILTINS_INT8) or ``"16x8"`` (int16 activations, int8
    weights). ``per_channel_dense=False`` sets the converter's
    ``_experimental_disable_per_channel_quantization_for_dense_layers`` (what TVM's own importer needs).
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r} (known: {', '.join(MODELS)})")
    if quantization not in ("int8", "16x8") or io_dtype not in ("int8", "uint8", "int16"):
        raise ValueError(f"quantization {quantization!r} / io_dtype {io_dtype!r}")
    return {"name": name, "size": size, "classes": classes, "seed": seed, "io_dtype": io_dtype,
            "quantization": quantization, "per_channel_dense": per_channel_dense, "calibration": calibration,
            "cut": cut, "alpha": alpha}


def cache_dir() -> str:
    return os.environ.get("REFCG_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "refcodegen"))


def make_tflite(name: str, **options) -> str:
    """Path of the converted model (built in a child process on the first call)."""
    config = settings(name, **options)
    try:
        tf_version = metadata.version("tensorflow-cpu")
    except metadata.PackageNotFoundError:
        tf_version = metadata.version("tensorflow")  # raises when neither is installed
    key = hashlib.sha256(json.dumps([config, tf_version, _source_digest()], sort_keys=True).encode()).hexdigest()[:16]
    path = os.path.join(cache_dir(), "tflite", f"{name}-{key}.tflite")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one conversion per file when pytest-xdist workers ask together
        if not os.path.isfile(path):
            _convert_in_child(config, path)
    return path


def _convert_in_child(config: dict, path: str):
    partial = f"{path}.{os.getpid()}.tmp"  # renamed when complete: a killed run leaves no half file
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    child = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"
    done = subprocess.run([sys.executable, "-c", child, __file__, json.dumps(config), partial],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0 or not os.path.isfile(partial):
        if os.path.exists(partial):
            os.remove(partial)
        raise RuntimeError(f"converting {config['name']} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    os.replace(partial, path)


def _source_digest() -> str:
    """This file's hash: changing how models are made invalidates the cache."""
    with open(__file__, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:12]


# ---- everything below runs in the child process, with TensorFlow ----

def _small_cnn(keras, config):
    layers = keras.layers
    x = inputs = keras.Input((config["size"], config["size"], 3), name="image")
    x = layers.ReLU(6.0)(layers.BatchNormalization()(layers.Conv2D(16, 3, strides=2, padding="same")(x)))
    y = layers.ReLU()(layers.BatchNormalization()(layers.DepthwiseConv2D(3, padding="same")(x)))
    y = layers.BatchNormalization()(layers.Conv2D(16, 1)(y))
    x = layers.Add()([x, y])
    x = layers.MaxPooling2D(2)(layers.ReLU()(layers.Conv2D(32, 3, padding="same")(x)))
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(32, activation="relu")(x)
    return keras.Model(inputs, layers.Dense(config["classes"])(x))


def _two_io(keras, config):
    """Two inputs (image, side vector), two outputs: the loader's multi-input/output path."""
    layers = keras.layers
    image = keras.Input((config["size"], config["size"], 3), name="image")
    side = keras.Input((8,), name="side")
    x = layers.GlobalAveragePooling2D()(layers.Conv2D(8, 3, strides=2, activation="relu")(image))
    x = layers.Concatenate()([x, layers.Dense(8, activation="relu")(side)])
    return keras.Model([image, side], [layers.Dense(config["classes"], name="logits")(x),
                                       layers.Dense(4, name="aux")(x)])


def _build(keras, config):
    if config["name"] == "small_cnn":
        return _small_cnn(keras, config)
    if config["name"] == "two_io":
        return _two_io(keras, config)
    app, kwargs = KERAS_APPS[config["name"]]
    if config["alpha"] is not None:
        kwargs = {**kwargs, "alpha": config["alpha"]}
    model = getattr(keras.applications, app)(
        input_shape=(config["size"], config["size"], 3), weights=None, classes=config["classes"],
        classifier_activation=None, **kwargs)
    if not config["cut"]:
        return model
    x = keras.layers.GlobalAveragePooling2D()(model.get_layer(config["cut"]).output)
    return keras.Model(model.inputs, keras.layers.Dense(config["classes"])(x))


def _calibration(model, config, np):
    rng = np.random.default_rng(config["seed"])
    # keyed by input name: the converter's own input order need not be Keras's
    return [{t.name.split(":")[0]: rng.uniform(-1, 1, (1,) + tuple(t.shape[1:])).astype("float32")
             for t in model.inputs} for _ in range(config["calibration"])]


def _randomize_batch_norm(model, batch, np, seed):
    """Random gamma/beta, then moving statistics from one training-mode pass (momentum 0)."""
    rng = np.random.default_rng(seed + 1)
    norms = [layer for layer in model.layers if layer.__class__.__name__ == "BatchNormalization"]
    for layer in norms:
        channels = layer.gamma.shape[0]
        layer.gamma.assign(rng.uniform(0.5, 1.5, channels).astype("float32"))
        layer.beta.assign(rng.normal(0.0, 0.2, channels).astype("float32"))
        layer.momentum = 0.0
    if norms:
        model(batch, training=True)


def convert(config: dict, path: str):
    import numpy as np
    import tensorflow as tf

    keras = tf.keras
    keras.utils.set_random_seed(config["seed"])
    model = _build(keras, config)
    samples = _calibration(model, config, np)
    batch = [np.concatenate([sample[t.name.split(":")[0]] for sample in samples]) for t in model.inputs]
    _randomize_batch_norm(model, batch if len(batch) > 1 else batch[0], np, config["seed"])

    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: iter(samples)
    if config["quantization"] == "16x8":
        converter.target_spec.supported_ops = [
            tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
    else:
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = converter.inference_output_type = getattr(tf, config["io_dtype"])
    if not config["per_channel_dense"]:
        converter._experimental_disable_per_channel_quantization_for_dense_layers = True
    with open(path, "wb") as f:
        f.write(converter.convert())


if __name__ == "__main__":
    convert(json.loads(sys.argv[-2]), sys.argv[-1])
