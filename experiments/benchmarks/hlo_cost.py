"""FLOPs and bytes of a compiled XLA program, counted from its optimized HLO text with loop trip counts.

`compiled.cost_analysis()` counts the body of a `while` loop once (checked on XLA:CPU and
XLA:TPU in jax 0.10: a 10-step `lax.scan` of matmuls reports one step's FLOPs), and every
Qwen3 program here runs its layers, micro-batches and decode steps in loops. This walks
the per-device program instead: each computation's own cost, callees weighted by how
often they run (`while` bodies by `known_trip_count`, the costlier branch of a
`conditional`, fusions and calls once).

- FLOPs: `dot` = 2 x output elements x contracted size; `convolution` (XLA:TPU writes
  dots as convolutions) = 2 x output elements x kernel elements / output features.
  Elementwise work is not counted (it is a few percent of a transformer's matmuls).
- bytes: operands + results of every top-level op (fusions, dots, copies, collectives,
  custom calls; not the insides of a fusion, which stay in registers / VMEM), the way
  XLA's cost analysis charges a fusion; an operand a fusion only dynamic-slices is
  charged the slice (a layer of stacked weights), an in-place dynamic-update-slice the
  update. An estimate of HBM traffic, not a measurement.
"""

from __future__ import annotations

import dataclasses
import math
import re

DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
               "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 0.5, "u4": 0.5}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\((.*)\)\s*->\s*.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][\w\-]*)\((.*)$")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
# Ops that move no data of their own (views, tuples, control flow whose callees are walked).
_FREE = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while", "conditional", "call",
         "after-all", "partition-id", "replica-id", "iota", "opt-barrier", "add-dependency", "domain"}


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


@dataclasses.dataclass
class _Computation:
    shapes: dict  # value name -> type text
    instrs: list
    params: list = dataclasses.field(default_factory=list)  # parameter names in order


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
        name, type_text, op, rest = m.groups()
        ops_text, attrs = _split_operands(rest)
        operands = re.findall(r"%([\w.\-]+)", ops_text)
        cur.shapes[name] = type_text
        cur.instrs.append(_Instr(name, type_text, op, operands, attrs))
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


def _conv_flops(ins: _Instr, comp: _Computation) -> float:
    out = array_shapes(ins.type_text)
    rhs = array_shapes(comp.shapes.get(ins.operands[1], "")) if len(ins.operands) > 1 else []
    m = re.search(r"dim_labels=[^_]*_([^-]*)->", ins.attrs)
    if not out or not rhs or not m or "o" not in m.group(1):
        return 0.0
    kernel = rhs[0][1]
    out_features = kernel[m.group(1).index("o")]
    return 2.0 * math.prod(out[0][1]) * math.prod(kernel) / max(out_features, 1)


def _operand_bytes(comp: _Computation, ins: _Instr, callee: _Computation | None) -> float:
    """Bytes a top-level op reads and writes; a slice of a buffer is charged the slice, not the buffer."""
    out = type_bytes(ins.type_text)
    if ins.op == "dynamic-slice":
        return 2 * out
    if ins.op == "dynamic-update-slice":
        return 2 * type_bytes(comp.shapes.get(ins.operands[1], "")) if len(ins.operands) > 1 else out
    if callee is None:
        return out + sum(type_bytes(comp.shapes.get(o, "")) for o in ins.operands)
    total = 0.0
    in_place = None
    root = callee.instrs[-1] if callee.instrs else None
    if root is not None and root.op == "dynamic-update-slice" and len(root.operands) > 1:
        in_place = root.operands[0]
        out = type_bytes(callee.shapes.get(root.operands[1], ""))
    for operand, param in zip(ins.operands, callee.params):
        users = [u for u in callee.instrs if param in u.operands]
        if param == in_place:
            continue
        if users and all(u.op == "dynamic-slice" and u.operands[0] == param for u in users):
            total += sum(type_bytes(u.type_text) for u in users)
        else:
            total += type_bytes(comp.shapes.get(operand, ""))
    return total + out


@dataclasses.dataclass
class Cost:
    flops: float = 0.0
    bytes: float = 0.0
    unknown_trip_counts: int = 0  # while loops without a known trip count (counted once)

    def __add__(self, o: "Cost") -> "Cost":
        return Cost(self.flops + o.flops, self.bytes + o.bytes, self.unknown_trip_counts + o.unknown_trip_counts)

    def scaled(self, k: float) -> "Cost":
        return Cost(self.flops * k, self.bytes * k, self.unknown_trip_counts)


def program_cost(hlo_text: str) -> Cost:
    """Per-device FLOPs and bytes of one optimized HLO module (`compiled.as_text()`)."""
    comps, entry = parse(hlo_text)
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
            if top_level and ins.op not in _FREE:
                callee = re.search(r"calls=%?([\w.\-]+)", ins.attrs) if ins.op == "fusion" else None
                total.bytes += _operand_bytes(comp, ins, comps.get(callee.group(1)) if callee else None)
            if ins.op == "while":
                body = re.search(r"body=%?([\w.\-]+)", ins.attrs)
                trip = _TRIP.search(ins.attrs)
                inner = walk(body.group(1), True) if body else Cost()
                if trip:
                    total = total + inner.scaled(int(trip.group(1)))
                else:
                    total = total + inner + Cost(unknown_trip_counts=1)
            elif ins.op == "conditional":
                branches = re.findall(r"%([\w.\-]+)", " ".join(
                    re.findall(r"(?:branch_computations=\{[^}]*\}|true_computation=%[\w.\-]+|"
                               r"false_computation=%[\w.\-]+)", ins.attrs)))
                costs = [walk(b, True) for b in branches]
                if costs:
                    total = total + max(costs, key=lambda c: c.flops)
            elif ins.op in ("call", "async-start"):
                for callee in re.findall(r"(?:to_apply|calls)=%?([\w.\-]+)", ins.attrs):
                    total = total + walk(callee, True)
            elif ins.op == "fusion" or ins.op == "custom-call":
                for callee in re.findall(r"calls=%?([\w.\-]+)", ins.attrs):
                    total = total + Cost(walk(callee, False).flops)
        memo[key] = total
        return total

    return walk(entry, True)
