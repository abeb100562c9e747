"""ONNX export of a trained model (needs the 'onnx' extra).

Graph: input ``image`` float32 (N, C, H, W), RAW pixel values as stored
(RGB 0..255, or the data set's bands in prep's units: 0..255, or 0..65,535
for a uint16 set), NCHW; the training normalisation is folded in as
Sub(mean) and Div(std);
then each layer's own node(s) in the model's layer order (``Layer.onnx``
in ibtmpi/layers/: Conv, MaxPool, AveragePool, Relu, Flatten, Gemm;
dropout is the identity at inference); outputs ``logits`` (N, K) and
``probs`` = Softmax(logits). Opset 17. Tests: tests/unit/test_outputs.py
runs onnxruntime on it against our own forward, tests/unit/test_model.py on
an avgpool model.
"""
from __future__ import annotations

import numpy as np


IR_VERSION = 8


def build(trained):
    try:
        import onnx
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        raise RuntimeError("ONNX export needs the onnx package: pip install 'ibtmpi[onnx]'") from None
    m = trained.model
    c = m.input_shape[0]
    inits = [numpy_helper.from_array(trained.mean.reshape(1, c, 1, 1).astype(np.float32), "mean"),
             numpy_helper.from_array(trained.std.reshape(1, c, 1, 1).astype(np.float32), "std")]
    nodes = [helper.make_node("Sub", ["image", "mean"], ["centred"]),
             helper.make_node("Div", ["centred", "std"], ["x0"])]
    cur = "x0"
    for i, layer in enumerate(m.layers):
        out = f"x{i + 1}"
        more_nodes, more_inits = layer.onnx(cur, out, i, helper, numpy_helper)
        nodes += more_nodes
        inits += more_inits
        cur = out
    nodes.append(helper.make_node("Identity", [cur], ["logits"]))
    nodes.append(helper.make_node("Softmax", ["logits"], ["probs"], axis=1))
    k = len(trained.classes)
    graph = helper.make_graph(
        nodes, "ibtmpi_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                       ["N", *m.input_shape])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", k]),
         helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", k])],
        inits)
    # IR version 8 is the one of opset 17 (ONNX 1.12); make_model would stamp
    # the installed onnx's newest, which older onnxruntime releases refuse
    # (onnx 1.19 writes IR 12, onnxruntime 1.19 reads up to IR 10)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="ibtmpi", ir_version=IR_VERSION)
    model.metadata_props.add(key="classes", value=",".join(trained.classes))
    model.metadata_props.add(key="input", value=(
        "float32 NCHW " + ("RGB" if c == 3 else f"{c}-band") + " pixel values "
        f"0..{getattr(trained, 'stored_max', 255.0):.0f} as stored; normalisation folded in"))
    onnx.checker.check_model(model)
    return model


def export(trained, path):
    model = build(trained)             # says what to install when onnx is missing
    import onnx
    onnx.save(model, path)
    return model
