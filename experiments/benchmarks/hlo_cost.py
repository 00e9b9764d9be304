"""FLOPs and bytes of a compiled XLA program, counted from its optimized HLO text with loop trip counts.

`compiled.cost_analysis()` counts the body of a `while` loop once (checked on XLA:CPU and
XLA:TPU in jax 0.10: a 10-step `lax.scan` of matmuls reports one step's FLOPs), and every
Qwen3 program here runs its layers, micro-batches and decode steps in loops. This walks
the per-device program instead: each computation's own cost, callees weighted by how
often they run (`while` bodies by `known_trip_count`, or where XLA left it out, as XLA:TPU
does, by the counted-loop pattern the body and condition spell out: `trip_count`; the
costlier branch of a `conditional`; fusions and calls once).

- FLOPs: `dot` = 2 x output elements x contracted size; `convolution` (XLA:TPU writes
  dots as convolutions, an fsdp-gathered one with a window mostly over padding) = 2 x batch x
  input features x output features x the window taps that land on input elements. Elementwise
  work is not counted (it is a few percent of a transformer's matmuls), nor the insides of a
  kernel custom call (Mosaic, Triton, cuDNN: `Cost.opaque_kernels` says how many the program has).
- bytes: operands + results of every top-level op (fusions, dots, copies, collectives,
  custom calls; not the insides of a fusion, which stay in registers / VMEM; not XLA:TPU's
  prefetch copies to and from on-chip memory), the way XLA's cost analysis charges a fusion;
  an asynchronous collective once, at its start (its result: the buffers it reads and
  writes); an operand a fusion only dynamic-slices is charged the slice (a layer of stacked
  weights), an in-place dynamic-update-slice or scatter the update (a decode step's keys and
  values written into the cache). An estimate of HBM traffic, not a measurement.
"""

from __future__ import annotations

import dataclasses
import math
import re

DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
               "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 0.5, "u4": 0.5}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\((.*)\)\s*->\s*.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][\w\-]*)\((.*)$")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
# Ops that move no data of their own (views, tuples, control flow whose callees are walked), and
# XLA:TPU's prefetches and evictions between HBM and on-chip memory (`copy-start` / `copy-done` to or
# from memory space S(1)): the op that reads or writes the value is charged its bytes already.
_FREE = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while", "conditional", "call",
         "after-all", "partition-id", "replica-id", "iota", "opt-barrier", "add-dependency", "domain",
         "copy-start", "copy-done", "all-gather-done", "all-reduce-done", "collective-permute-done"}
# Asynchronous collectives: the start's result holds the buffers read and written; the done moves nothing more.
_ASYNC_STARTS = {"all-gather-start", "all-reduce-start", "collective-permute-start"}


def array_shapes(type_text: str) -> list[tuple[str, tuple[int, ...]]]:
    """[(dtype, dims)] of every array in an HLO type ('f32[2,3]{1,0}' or a tuple of them)."""
    return [(d, tuple(int(x) for x in dims.split(",") if x)) for d, dims in _ARRAY.findall(type_text)
            if d in DTYPE_BYTES]


def type_bytes(type_text: str) -> float:
    return sum(DTYPE_BYTES[d] * math.prod(s) for d, s in array_shapes(type_text))


def _split_operands(rest: str) -> tuple[str, str]:
    """`a, b), attr=...` -> ('a, b', 'attr=...'): the operand list up to its closing parenthesis."""
    depth = 1
    for i, ch in enumerate(rest):
        depth += ch in "({[" or -(ch in ")}]")
        if depth == 0:
            return rest[:i], rest[i + 1:]
    return rest, ""


@dataclasses.dataclass
class _Instr:
    name: str
    type_text: str
    op: str
    operands: list[str]
    attrs: str
    literal: str = ""  # the operand text as written (a constant's value)


@dataclasses.dataclass
class _Computation:
    shapes: dict  # value name -> type text
    instrs: list
    params: list = dataclasses.field(default_factory=list)  # parameter names in order
    by_name: dict = dataclasses.field(default_factory=dict)  # value name -> _Instr
    root: str = ""  # the ROOT instruction's name
    callers: list = dataclasses.field(default_factory=list)  # (computation, `call` instruction) calling it


def parse(hlo_text: str) -> tuple[dict[str, _Computation], str]:
    """{computation name: _Computation} and the entry computation's name."""
    comps, entry, cur = {}, "", None
    for line in hlo_text.splitlines():
        m = _HEADER.match(line)
        if m and not line.startswith(" "):
            cur = _Computation({}, [])
            comps[m.group(1)] = cur
            if line.startswith("ENTRY"):
                entry = m.group(1)
            for p in re.finditer(r"([\w.\-]+):\s*((?:\([^)]*\))|[a-z0-9]+\[[0-9,]*\](?:\{[^}]*\})?)", m.group(2)):
                cur.shapes[p.group(1)] = p.group(2)
                cur.params.append(p.group(1))
            continue
        if cur is None:
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        root, name, type_text, op, rest = m.groups()
        ops_text, attrs = _split_operands(rest)
        operands = re.findall(r"%([\w.\-]+)", ops_text)
        cur.shapes[name] = type_text
        cur.instrs.append(_Instr(name, type_text, op, operands, attrs, ops_text.strip()))
        cur.by_name[name] = cur.instrs[-1]
        if root:
            cur.root = name
    for comp in comps.values():
        for ins in comp.instrs:
            if ins.op == "call":
                for callee in re.findall(r"to_apply=%?([\w.\-]+)", ins.attrs):
                    if callee in comps:
                        comps[callee].callers.append((comp, ins))
    return comps, entry


def _dims(attrs: str, key: str) -> tuple[int, ...]:
    m = re.search(key + r"=\{([0-9,]*)\}", attrs)
    return tuple(int(x) for x in m.group(1).split(",") if x) if m else ()


def _dot_flops(ins: _Instr, comp: _Computation) -> float:
    out = array_shapes(ins.type_text)
    lhs = array_shapes(comp.shapes.get(ins.operands[0], "")) if ins.operands else []
    if not out or not lhs:
        return 0.0
    contracted = math.prod(lhs[0][1][i] for i in _dims(ins.attrs, "lhs_contracting_dims"))
    return 2.0 * math.prod(out[0][1]) * contracted


def _window(attrs: str, key: str, n: int, default: int) -> list[int]:
    m = re.search(r"\b" + key + r"=([0-9x]+)", attrs)
    return [int(x) for x in m.group(1).split("x")] if m else [default] * n


def _valid_taps(out: int, size: int, window: int, low: int, stride: int, dilation: int, input_dilation: int) -> int:
    """(output position, window tap) pairs of one spatial dimension that land on an input element
    (not on padding, nor between the elements of a dilated input)."""
    taps = 0
    for w in range(window):
        offset = w * dilation - low
        if input_dilation == 1:  # o * stride + offset in [0, size): o from ceil(-offset / stride)
            first, last = max(0, -(offset // stride)), min(out - 1, (size - 1 - offset) // stride)
            taps += max(0, last - first + 1)
        else:
            taps += sum(1 for o in range(out) if (i := o * stride + offset) >= 0 and i % input_dilation == 0
                        and i // input_dilation < size)
    return taps


def _conv_flops(ins: _Instr, comp: _Computation) -> float:
    """2 x batch x input features (per group) x output features x the valid taps of each spatial
    dimension (XLA:TPU writes an fsdp-gathered matmul as a convolution whose window runs mostly over
    padding: those taps do no work)."""
    out = array_shapes(ins.type_text)
    lhs = array_shapes(comp.shapes.get(ins.operands[0], "")) if ins.operands else []
    m = re.search(r"dim_labels=([0-9bf]+)_([0-9io]+)->([0-9bf]+)", ins.attrs)
    if not out or not lhs or not m:
        return 0.0
    lhs_labels, out_labels = m.group(1), m.group(3)
    lhs_dims, out_dims = lhs[0][1], out[0][1]
    if len(lhs_labels) != len(lhs_dims) or len(out_labels) != len(out_dims):
        return 0.0
    spatial = sorted(int(c) for c in lhs_labels if c.isdigit())
    n = len(spatial)
    size = _window(ins.attrs, "size", n, 1)
    stride, dilation = _window(ins.attrs, "stride", n, 1), _window(ins.attrs, "rhs_dilate", n, 1)
    input_dilation = _window(ins.attrs, "lhs_dilate", n, 1)
    pad = re.search(r"\bpad=([0-9_x\-]+)", ins.attrs)
    low = [int(p.split("_")[0]) for p in pad.group(1).split("x")] if pad else [0] * n
    groups = re.search(r"feature_group_count=(\d+)", ins.attrs)
    features_in = lhs_dims[lhs_labels.index("f")] // (int(groups.group(1)) if groups else 1)
    taps = 1
    for k in spatial:
        taps *= _valid_taps(out_dims[out_labels.index(str(k))], lhs_dims[lhs_labels.index(str(k))], size[k], low[k],
                            stride[k], dilation[k], input_dilation[k])
    return 2.0 * out_dims[out_labels.index("b")] * features_in * out_dims[out_labels.index("f")] * taps


def _sliced_bytes(comps: dict[str, _Computation], fused: _Computation, param: str, depth: int = 0) -> float | None:
    """The bytes a fused computation reads of its parameter `param` when it only dynamic-slices it (directly or
    inside a nested fusion, as XLA:TPU nests them): the slices; None when it reads it whole."""
    users = [u for u in fused.instrs if param in u.operands]
    if not users or depth > 8:
        return None
    total = 0.0
    for u in users:
        if u.op == "dynamic-slice" and u.operands[0] == param:
            total += type_bytes(u.type_text)
            continue
        called = re.search(r"calls=%?([\w.\-]+)", u.attrs) if u.op == "fusion" else None
        inner = comps.get(called.group(1)) if called else None
        if inner is None or u.operands.count(param) != 1 or u.operands.index(param) >= len(inner.params):
            return None
        sliced = _sliced_bytes(comps, inner, inner.params[u.operands.index(param)], depth + 1)
        if sliced is None:
            return None
        total += sliced
    return total


def _operand_bytes(comps: dict[str, _Computation], comp: _Computation, ins: _Instr,
                   callee: _Computation | None) -> float:
    """Bytes a top-level op reads and writes; a slice of a buffer is charged the slice, not the buffer."""
    out = type_bytes(ins.type_text)
    if ins.op in _ASYNC_STARTS:
        return out
    if ins.op == "dynamic-slice":
        return 2 * out
    if ins.op == "dynamic-update-slice":
        return 2 * type_bytes(comp.shapes.get(ins.operands[1], "")) if len(ins.operands) > 1 else out
    if ins.op == "scatter" and len(ins.operands) == 3:  # in place: the updates read and written, the indices
        return 2 * type_bytes(comp.shapes.get(ins.operands[2], "")) + type_bytes(comp.shapes.get(ins.operands[1], ""))
    if callee is None:
        return out + sum(type_bytes(comp.shapes.get(o, "")) for o in ins.operands)
    total = 0.0
    in_place = None
    root = callee.by_name.get(callee.root) or (callee.instrs[-1] if callee.instrs else None)
    if root is not None and root.op == "dynamic-update-slice" and len(root.operands) > 1:
        in_place = root.operands[0]
        out = type_bytes(callee.shapes.get(root.operands[1], ""))
    elif root is not None and root.op == "scatter" and len(root.operands) == 3:  # a KV cache written in place
        in_place = root.operands[0]
        out = type_bytes(callee.shapes.get(root.operands[2], ""))
    for operand, param in zip(ins.operands, callee.params):
        if param == in_place:
            continue
        sliced = _sliced_bytes(comps, callee, param)
        total += type_bytes(comp.shapes.get(operand, "")) if sliced is None else sliced
    return total + out


_PASS_THROUGH = {"copy", "bitcast", "convert"}  # ops that only move or relayout a value


def _source(comps: dict[str, _Computation], comp: _Computation, name: str) -> _Instr | None:
    """The instruction that makes `name`, looking through copies and bitcasts (XLA:TPU copies a loop
    counter into another memory space before it adds to it) and through a fusion that wraps one
    operation of its parameters (XLA:CPU's `wrapped_add`, `wrapped_compare`): that operation, on the
    fusion's operands."""
    ins = comp.by_name.get(name)
    for _ in range(16):
        if ins is not None and ins.op == "fusion":
            called = re.search(r"calls=%?([\w.\-]+)", ins.attrs)
            inner = comps.get(called.group(1)) if called else None
            op = inner.by_name.get(inner.root) if inner is not None else None
            if op is None or not op.operands or any(o not in inner.params for o in op.operands):
                return ins
            return dataclasses.replace(op, operands=[ins.operands[inner.params.index(o)] for o in op.operands])
        if ins is None or ins.op not in _PASS_THROUGH or not ins.operands:
            return ins
        ins = comp.by_name.get(ins.operands[0])
    return ins


def _int_value(comps: dict[str, _Computation], comp: _Computation, name: str, depth: int = 0) -> int | None:
    """The integer `name` holds when it is a constant: written in `comp`, or passed in through a tuple
    element or a parameter of the one `call` of `comp` (XLA:CPU outlines loops into called
    computations); None otherwise."""
    ins = _source(comps, comp, name)
    if ins is None or depth > 16:
        return None
    if ins.op == "constant":
        return int(ins.literal) if re.fullmatch(r"-?\d+", ins.literal) else None
    if ins.op == "get-tuple-element" and ins.operands:
        m = re.search(r"index=(\d+)", ins.attrs)
        element = _tuple_element(comps, comp, ins.operands[0], int(m.group(1)), depth + 1) if m else None
        return _int_value(comps, element[0], element[1], depth + 1) if element else None
    if ins.op == "parameter":
        passed = _passed_in(comp, ins)
        return _int_value(comps, passed[0], passed[1], depth + 1) if passed else None
    return None


def _passed_in(comp: _Computation, param: _Instr) -> tuple[_Computation, str] | None:
    """(caller, operand) for a parameter of a computation with one `call` site."""
    if len(comp.callers) != 1 or not re.fullmatch(r"\d+", param.literal):
        return None
    caller, call = comp.callers[0]
    index = int(param.literal)
    return (caller, call.operands[index]) if index < len(call.operands) else None


def _tuple_element(comps: dict[str, _Computation], comp: _Computation, name: str, k: int,
                   depth: int = 0) -> tuple[_Computation, str] | None:
    """(computation, value name) of element `k` of the tuple `name`: a `tuple` written in `comp`, or
    one passed in as a parameter of its one `call`."""
    ins = _source(comps, comp, name)
    if ins is None or depth > 16:
        return None
    if ins.op == "tuple":
        return (comp, ins.operands[k]) if k < len(ins.operands) else None
    if ins.op == "parameter":
        passed = _passed_in(comp, ins)
        return _tuple_element(comps, passed[0], passed[1], k, depth + 1) if passed else None
    return None


def _tuple_index(ins: _Instr | None, comp: _Computation) -> int | None:
    """k when `ins` is get-tuple-element(parameter 0 of `comp`), index=k."""
    if ins is None or ins.op != "get-tuple-element" or not ins.operands or not comp.params:
        return None
    if ins.operands[0] != comp.params[0]:
        return None
    m = re.search(r"index=(\d+)", ins.attrs)
    return int(m.group(1)) if m else None


def trip_count(comps: dict[str, _Computation], comp: _Computation, loop: _Instr) -> int | None:
    """The trip count of `loop` (a `while` in `comp`): XLA's `known_trip_count`, else the counted
    loop its condition and body spell out (counter `i` in the loop tuple at index k, starting at a
    constant, `i < N` or `N > i` against a constant, the body adding a positive constant to it);
    None when neither says (a data-dependent exit)."""
    known = _TRIP.search(loop.attrs)
    if known:
        return int(known.group(1))
    cond_name = re.search(r"condition=%?([\w.\-]+)", loop.attrs)
    body_name = re.search(r"body=%?([\w.\-]+)", loop.attrs)
    cond = comps.get(cond_name.group(1)) if cond_name else None
    body = comps.get(body_name.group(1)) if body_name else None
    if cond is None or body is None or not loop.operands:
        return None
    test = _source(comps, cond, cond.root)
    direction = re.search(r"direction=(LT|GT)", test.attrs) if test is not None and test.op == "compare" else None
    if direction is None or len(test.operands) != 2:
        return None
    counter, bound = test.operands if direction.group(1) == "LT" else test.operands[::-1]
    k, end = _tuple_index(_source(comps, cond, counter), cond), _int_value(comps, cond, bound)
    init = _tuple_element(comps, comp, loop.operands[0], k) if k is not None else None
    start = _int_value(comps, *init) if init else None
    out = _source(comps, body, body.root)
    if end is None or start is None or out is None or out.op != "tuple" or k >= len(out.operands):
        return None
    step = _source(comps, body, out.operands[k])
    if step is None or step.op != "add" or len(step.operands) != 2:
        return None
    counter_in, other = step.operands
    if _tuple_index(_source(comps, body, counter_in), body) != k:
        counter_in, other = other, counter_in
    increment = _int_value(comps, body, other)
    if _tuple_index(_source(comps, body, counter_in), body) != k or increment is None or increment <= 0:
        return None
    return max(0, -(-(end - start) // increment))


def _branches(ins: _Instr) -> list[str]:
    """The branch computations of a `conditional`."""
    return re.findall(r"%([\w.\-]+)", " ".join(re.findall(
        r"(?:branch_computations=\{[^}]*\}|true_computation=%[\w.\-]+|false_computation=%[\w.\-]+)", ins.attrs)))


def _charged_bytes(comps: dict[str, _Computation], comp: _Computation, ins: _Instr) -> float:
    """What a top-level op of `comp` is charged (`_operand_bytes`; nothing for the ops in `_FREE`)."""
    if ins.op in _FREE:
        return 0.0
    callee = re.search(r"calls=%?([\w.\-]+)", ins.attrs) if ins.op == "fusion" else None
    return _operand_bytes(comps, comp, ins, comps.get(callee.group(1)) if callee else None)


# Custom calls that run a compiled kernel whose FLOPs the HLO does not show (Mosaic on TPU, Triton
# and cuDNN on GPU): their bytes are charged, their FLOPs are not.
_OPAQUE_KERNELS = re.compile(r'custom_call_target="(tpu_custom_call|__gpu\$xla\.gpu\.triton|__cudnn\$[^"]*)"')


@dataclasses.dataclass
class Cost:
    flops: float = 0.0
    bytes: float = 0.0
    unknown_trip_counts: int = 0  # while loops without a known trip count (counted once)
    opaque_kernels: int = 0  # kernel custom calls in the program whose FLOPs are not counted

    def __add__(self, o: "Cost") -> "Cost":
        return Cost(self.flops + o.flops, self.bytes + o.bytes, self.unknown_trip_counts + o.unknown_trip_counts,
                    self.opaque_kernels + o.opaque_kernels)

    def scaled(self, k: float) -> "Cost":
        return Cost(self.flops * k, self.bytes * k, self.unknown_trip_counts, self.opaque_kernels)


def program_cost(hlo_text: str) -> Cost:
    """Per-device FLOPs and bytes of one optimized HLO module (`compiled.as_text()`)."""
    return computation_cost(*parse(hlo_text))


def computation_cost(comps: dict[str, _Computation], entry: str) -> Cost:
    """FLOPs and bytes of computation `entry` of a parsed module, as `program_cost` counts them."""
    memo: dict[tuple[str, bool], Cost] = {}

    def walk(name: str, top_level: bool) -> Cost:
        key = (name, top_level)
        if key in memo:
            return memo[key]
        comp = comps.get(name)
        total = Cost()
        if comp is None:
            return total
        for ins in comp.instrs:
            if ins.op == "dot":
                total.flops += _dot_flops(ins, comp)
            elif ins.op == "convolution":
                total.flops += _conv_flops(ins, comp)
            if top_level:
                total.bytes += _charged_bytes(comps, comp, ins)
            if ins.op == "while":
                body = re.search(r"body=%?([\w.\-]+)", ins.attrs)
                trip = trip_count(comps, comp, ins)
                inner = walk(body.group(1), True) if body else Cost()
                if trip is not None:
                    total = total + inner.scaled(trip)
                else:
                    total = total + inner + Cost(unknown_trip_counts=1)
            elif ins.op == "conditional":
                costs = [walk(b, True) for b in _branches(ins)]
                if costs:
                    total = total + max(costs, key=lambda c: c.flops)
            elif ins.op in ("call", "async-start"):
                for callee in re.findall(r"(?:to_apply|calls)=%?([\w.\-]+)", ins.attrs):
                    total = total + walk(callee, True)
            elif ins.op == "fusion" or ins.op == "custom-call":
                for callee in re.findall(r"calls=%?([\w.\-]+)", ins.attrs):
                    total = total + Cost(walk(callee, False).flops)
                if ins.op == "custom-call" and _OPAQUE_KERNELS.search(ins.attrs):
                    total.opaque_kernels += 1
        memo[key] = total
        return total

    return walk(entry, True)


def _op_name(ins: _Instr) -> str:
    m = re.search(r'op_name="([^"]*)"', ins.attrs)
    return m.group(1) if m else ""


def top_level_ops(comps: dict[str, _Computation], entry: str):
    """Every top-level op of computation `entry` as `program_cost` walks it: (computation, op, how many
    times it runs: the trip counts of the loops around it, a loop with no trip count once, whether it
    runs inside such a loop); a `conditional` contributes its costlier branch in FLOPs."""
    def walk(name: str, times: float, data_dependent: bool, depth: int):
        comp = comps.get(name)
        if comp is None or depth > 64:
            return
        for ins in comp.instrs:
            yield comp, ins, times, data_dependent
            if ins.op == "while":
                body = re.search(r"body=%?([\w.\-]+)", ins.attrs)
                trip = trip_count(comps, comp, ins)
                if body:
                    yield from walk(body.group(1), times * (trip or 1), data_dependent or trip is None, depth + 1)
            elif ins.op == "conditional":
                costs = {b: computation_cost(comps, b) for b in _branches(ins)}
                if costs:
                    yield from walk(max(costs, key=lambda b: costs[b].flops), times, data_dependent, depth + 1)
            elif ins.op in ("call", "async-start"):
                for callee in re.findall(r"(?:to_apply|calls)=%?([\w.\-]+)", ins.attrs):
                    yield from walk(callee, times, data_dependent, depth + 1)

    return walk(entry, 1.0, False, 0)


def byte_terms(comps: dict[str, _Computation], entry: str) -> dict[str, float]:
    """`program_cost`'s bytes split by where they come from: {"<op> <op_name>": bytes per device},
    each top-level op charged as there, times the trip counts of the loops around it (a loop with no
    trip count once). The biggest terms are the traffic worth cutting first."""
    terms: dict[str, float] = {}
    for comp, ins, times, _ in top_level_ops(comps, entry):
        if ins.op not in _FREE:
            label = f"{ins.op} {_op_name(ins)}".strip()
            terms[label] = terms.get(label, 0.0) + times * _charged_bytes(comps, comp, ins)
    return terms


def all_gather_bytes_in_decode_loops(hlo_text: str) -> float:
    """Bytes all-gathered by one step of the program's decode loops (the loops that exit on a
    condition of the data: no trip count), their nested layer loops' trips counted."""
    return sum(times * type_bytes(ins.type_text)
               for _, ins, times, in_decode in top_level_ops(*parse(hlo_text))
               if in_decode and ins.op in ("all-gather", "all-gather-start"))
