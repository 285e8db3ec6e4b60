"""TFLite models with WHILE and IF (subgraphs built with the project's builder), for the delegate's
control-flow tests. Counters are int32 tensors of shape [1], or rank-0 (``counter=()``, as converters
write them: the delegate maps those as NNAPI [1] tensors, delegate.mapping.scalars)."""
from __future__ import annotations

import numpy as np

from delegate.tfl.builder import TfLiteModelBuilder

SHAPE = (2, 3)
TRIPS = (0, 1, 2, 7)  # 0: the body never runs
NONE = ("AddOptions", {"fused_activation_function": 0})


COUNTER = (1,)


def _loop_signature(g: TfLiteModelBuilder, shape=SHAPE, counter=COUNTER) -> tuple[int, int, int]:
    return (g.add_input("i", list(counter), np.int32), g.add_input("x", list(shape)),
            g.add_input("n", list(counter), np.int32))


def add_counter_cond(root: TfLiteModelBuilder, shape=SHAPE, scalar_output: bool = False, counter=COUNTER
                     ) -> TfLiteModelBuilder:
    """(i, x, n) -> i < n; ``scalar_output``: the bool is declared with shape [] (TFLite allows both)."""
    g = root.add_subgraph("cond")
    i, _, n = _loop_signature(g, shape, counter)
    out = g.add_tensor("less", [] if scalar_output or not counter else [1], np.bool_)
    g.add_operator("LESS", [i, n], [out])
    g.set_outputs([out])
    return g


def add_counter_body(root: TfLiteModelBuilder, seed: int = 0, shape=SHAPE, unmappable: bool = False,
                     counter=COUNTER) -> TfLiteModelBuilder:
    """(i, x, n) -> (i + 1, x * 0.5 + c, n): ``n`` passes through unchanged (the body's output is its
    input tensor, as converted TFLite loops have it). ``unmappable``: x goes through a
    FLOOR_MOD first, which has no NNAPI mapping."""
    g = root.add_subgraph("body")
    i, x, n = _loop_signature(g, shape, counter)
    rng = np.random.default_rng(seed)
    one = g.add_constant("one", np.ones(counter, np.int32))
    half = g.add_constant("half", np.float32([0.5]))
    c = g.add_constant("c", rng.standard_normal(shape[-1:]).astype(np.float32))
    i2 = g.add_tensor("i2", list(counter), np.int32)
    t, x2 = g.add_tensor("t", list(shape)), g.add_tensor("x2", list(shape))
    g.add_operator("ADD", [i, one], [i2], NONE)
    if unmappable:
        three = g.add_constant("three", np.float32([3.0]))
        m = g.add_tensor("m", list(shape))
        g.add_operator("FLOOR_MOD", [x, three], [m])
        x = m
    g.add_operator("MUL", [x, half], [t], ("MulOptions", {"fused_activation_function": 0}))
    g.add_operator("ADD", [t, c], [x2], NONE)
    g.set_outputs([i2, x2, n])
    return g


def add_while(g: TfLiteModelBuilder, cond: TfLiteModelBuilder, body: TfLiteModelBuilder, inputs, shape=SHAPE,
              name: str = "w", counter=COUNTER) -> tuple[int, int, int]:
    outs = (g.add_tensor(f"{name}_i", list(counter), np.int32), g.add_tensor(f"{name}_x", list(shape)),
            g.add_tensor(f"{name}_n", list(counter), np.int32))
    g.add_operator("WHILE", list(inputs), list(outs),
                   ("WhileOptions", {"cond_subgraph_index": cond.index, "body_subgraph_index": body.index}))
    return outs


def counter_loop_model(seed: int = 0, *, unmappable_body: bool = False, scalar_cond: bool = False,
                       pre_post: bool = True, scalar_counter: bool = False) -> bytes:
    """x: [2, 3] float32, n: [1] int32 -> WHILE i < n: (i + 1, x * 0.5 + c), from i = 0; outputs
    (x, i). ``pre_post``: an ADD before and a MUL after the loop, so the loop sits inside a partition.
    ``scalar_counter``: i and n are rank-0 int32 tensors (and the cond's bool), as converters write."""
    counter = () if scalar_counter else COUNTER
    b = TfLiteModelBuilder()
    x = b.add_input("x", list(SHAPE))
    n = b.add_input("n", list(counter), np.int32)
    zero = b.add_constant("zero", np.zeros(counter, np.int32))
    if pre_post:
        bias = b.add_constant("bias", np.float32([0.25, -1.0, 2.0]))
        x1 = b.add_tensor("x1", list(SHAPE))
        b.add_operator("ADD", [x, bias], [x1], NONE)
        x = x1
    cond = add_counter_cond(b, scalar_output=scalar_cond, counter=counter)
    body = add_counter_body(b, seed, unmappable=unmappable_body, counter=counter)
    i_out, x_out, _ = add_while(b, cond, body, [zero, x, n], counter=counter)
    if pre_post:
        y = b.add_tensor("y", list(SHAPE))
        b.add_operator("MUL", [x_out, x_out], [y], ("MulOptions", {"fused_activation_function": 0}))
        x_out = y
    b.set_outputs([x_out, i_out])
    return b.build()


def if_model(nested_while: bool = False, constant_cond: bool | None = None) -> bytes:
    """c: [1] bool, a, b: [2, 3] float32 -> IF c: a + b (then) else a * b - 1 (else).
    ``nested_while``: the then-branch runs the counter loop on a + b, 3 times, instead.
    ``constant_cond``: c is a constant of shape [] (not an input)."""
    root = TfLiteModelBuilder()
    c = root.add_input("c", [1], np.bool_) if constant_cond is None else \
        root.add_constant("c", np.array(constant_cond))
    a = root.add_input("a", list(SHAPE))
    bb = root.add_input("b", list(SHAPE))
    then = root.add_subgraph("then")
    ta, tb = then.add_input("a", list(SHAPE)), then.add_input("b", list(SHAPE))
    s = then.add_tensor("sum", list(SHAPE))
    then.add_operator("ADD", [ta, tb], [s], NONE)
    if nested_while:
        cond, body = add_counter_cond(root), add_counter_body(root, seed=3)
        zero, three = then.add_constant("zero", np.int32([0])), then.add_constant("three", np.int32([3]))
        _, s, _ = add_while(then, cond, body, [zero, s, three])
    then.set_outputs([s])
    other = root.add_subgraph("else")
    ea, eb = other.add_input("a", list(SHAPE)), other.add_input("b", list(SHAPE))
    p, q = other.add_tensor("prod", list(SHAPE)), other.add_tensor("minus1", list(SHAPE))
    one = other.add_constant("one", np.float32([1.0]))
    other.add_operator("MUL", [ea, eb], [p], ("MulOptions", {"fused_activation_function": 0}))
    other.add_operator("SUB", [p, one], [q], ("SubOptions", {"fused_activation_function": 0}))
    other.set_outputs([q])
    out = root.add_tensor("out", list(SHAPE))
    root.add_operator("IF", [c, a, bb], [out],
                      ("IfOptions", {"then_subgraph_index": then.index, "else_subgraph_index": other.index}))
    root.set_outputs([out])
    return root.build()


def loop_feeds(rng, scalar_counter: bool = False) -> list[list[np.ndarray]]:
    """Inputs of counter_loop_model: one per trip count of TRIPS."""
    return [[rng.standard_normal(SHAPE).astype(np.float32) * 4, np.array(n if scalar_counter else [n], np.int32)]
            for n in TRIPS]


def if_feeds(rng) -> list[list[np.ndarray]]:
    """Inputs of if_model: both branches taken."""
    return [[np.array([c]), rng.standard_normal(SHAPE).astype(np.float32),
             rng.standard_normal(SHAPE).astype(np.float32)] for c in (True, False, True)]


RNN_UNITS, RNN_CLASSES, RNN_TRIPS = 64, 10, 16


def recurrent_loop_model(seed: int = 0, units: int = RNN_UNITS) -> bytes:
    """A recurrence as converters write tf.while_loop: x [1, units] float32, n [1] int32 ->
    WHILE i < n: (i + 1, h = tanh(FULLY_CONNECTED(h) + x)), from i = 0 and h = x; then a
    FULLY_CONNECTED classifier and SOFTMAX over its final state. Weights seeded, scaled so the
    state neither vanishes nor saturates over tens of trips (make bench runs it RNN_TRIPS times)."""
    rng = np.random.default_rng(seed)
    b = TfLiteModelBuilder(description="while-rnn")
    x = b.add_input("x", [1, units])
    n = b.add_input("n", list(COUNTER), np.int32)
    zero = b.add_constant("zero", np.zeros(COUNTER, np.int32))
    signature = [("i", list(COUNTER), np.int32), ("h", [1, units], np.float32), ("x", [1, units], np.float32),
                 ("n", list(COUNTER), np.int32)]
    cond = b.add_subgraph("cond")
    ci, _, _, cn = (cond.add_input(*s) for s in signature)
    less = cond.add_tensor("less", [1], np.bool_)
    cond.add_operator("LESS", [ci, cn], [less])
    cond.set_outputs([less])
    body = b.add_subgraph("body")
    i, h, bx, bn = (body.add_input(*s) for s in signature)
    one = body.add_constant("one", np.ones(COUNTER, np.int32))
    i2 = body.add_tensor("i2", list(COUNTER), np.int32)
    body.add_operator("ADD", [i, one], [i2], NONE)
    w = body.add_constant("w", (rng.uniform(-1.5, 1.5, (units, units)) / np.sqrt(units)).astype(np.float32))
    bias = body.add_constant("b", rng.uniform(-0.1, 0.1, units).astype(np.float32))
    fc, pre, h2 = (body.add_tensor(k, [1, units]) for k in ("fc", "pre", "h2"))
    body.add_operator("FULLY_CONNECTED", [h, w, bias], [fc], ("FullyConnectedOptions", {}))
    body.add_operator("ADD", [fc, bx], [pre], NONE)
    body.add_operator("TANH", [pre], [h2])
    body.set_outputs([i2, h2, bx, bn])
    outs = [b.add_tensor(f"w_{k}", s, t) for k, s, t in signature]
    b.add_operator("WHILE", [zero, x, x, n], outs,
                   ("WhileOptions", {"cond_subgraph_index": cond.index, "body_subgraph_index": body.index}))
    cw = b.add_constant("fc/w", rng.uniform(-0.3, 0.3, (RNN_CLASSES, units)).astype(np.float32))
    cb = b.add_constant("fc/b", rng.uniform(-0.1, 0.1, RNN_CLASSES).astype(np.float32))
    logits, probs = b.add_tensor("logits", [1, RNN_CLASSES]), b.add_tensor("probs", [1, RNN_CLASSES])
    b.add_operator("FULLY_CONNECTED", [outs[1], cw, cb], [logits], ("FullyConnectedOptions", {}))
    b.add_operator("SOFTMAX", [logits], [probs], ("SoftmaxOptions", {"beta": 1.0}))
    b.set_outputs([probs])
    return b.build()
