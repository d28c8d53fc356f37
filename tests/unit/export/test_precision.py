from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from export.precision import LOWEST, MASK_FLOOR, replace_scalar_constants


def scalar(name: str, value: float) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, dtype=np.float32), name)


def mask_graph() -> onnx.ModelProto:
    """An additive attention mask as the exporter writes it (Where(mask, 0, lowest)), plus constants that are
    not the mask: a scalar of another value and a tensor whose elements are all float32's lowest."""
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["lowest"], value=scalar("lowest_value", LOWEST)),
            helper.make_node("Where", ["keep", "zero", "lowest"], ["additive"]),
            helper.make_node("Add", ["scores", "additive"], ["masked"]),
            helper.make_node("Add", ["masked", "shift"], ["shifted"]),
            helper.make_node("Add", ["shifted", "row"], ["out"]),
        ],
        "mask",
        [
            helper.make_tensor_value_info("keep", TensorProto.BOOL, [2]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])],
        [
            scalar("zero", 0.0),
            scalar("shift", -10000.0),
            numpy_helper.from_array(np.full(2, LOWEST, dtype=np.float32), "row"),
        ],
    )
    return helper.make_model(graph)


def test_only_scalar_constants_at_float32s_lowest_are_raised_to_the_floor() -> None:
    model = mask_graph()
    assert replace_scalar_constants(model, LOWEST, MASK_FLOOR) == 1
    (constant,) = [node for node in model.graph.node if node.op_type == "Constant"]
    assert numpy_helper.to_array(constant.attribute[0].t).item() == MASK_FLOOR
    kept = {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}
    assert kept["zero"].item() == 0.0 and kept["shift"].item() == -10000.0
    assert (kept["row"] == LOWEST).all()  # not a scalar: not the mask


def test_an_initializer_mask_is_raised_too_and_a_second_pass_changes_nothing() -> None:
    model = mask_graph()
    model.graph.initializer.append(scalar("folded_lowest", LOWEST))
    assert replace_scalar_constants(model, LOWEST, MASK_FLOOR) == 2
    assert replace_scalar_constants(model, LOWEST, MASK_FLOOR) == 0
