"""Harness-owned output buffers with guard zones and poison, and input snapshots.

A candidate never allocates its own outputs (that is how stale-memory and cached-result
cheats pass leaderboards). `OutputBuffers` hands it `out` and `lse` as views into larger
allocations: a guard zone before and after each view, filled with a guard pattern, and the
view itself filled with a recognisable NaN ("poison") before every call. Afterwards:
- `unwritten()` finds elements still holding the poison bits (an output the candidate did
  not write: partial tiles, skipped rows, a lazy or cached result);
- `check_guards()` finds guard bytes that changed (a write outside the output: an
  out-of-bounds tile store, a wrong stride).
`InputSnapshot` keeps bitwise copies of the inputs and says which one a candidate changed.
`GradBuffers` is the same for a backward's dQ, dK and dV.
Everything works on CPU and CUDA tensors alike (comparisons happen on the tensors' device).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.core.cases import Case, Inputs

GUARD_BYTES = 4096
# Poison: quiet NaNs with a payload no arithmetic produces (canonical NaNs are 0x7E00,
# 0x7FC0, 0x7FC00000), so an element still holding these bits was never written.
POISON_BITS = {torch.float16: 0x7E5A, torch.bfloat16: 0x7FA5, torch.float32: 0x7FA5A5A5}
# Guards: ordinary finite numbers, distinct from the poison, so that a stray write of
# poison-like garbage and a stray write of real values are both visible.
GUARD_BITS = {torch.float16: 0x5BAD, torch.bfloat16: 0x4BAD, torch.float32: 0x4BADBEEF}
_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _signed(bits: int, nbytes: int) -> int:
    top = 1 << (8 * nbytes)
    return bits - top if bits >= top >> 1 else bits


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(_INT_VIEW[t.element_size()])


def _first_index(hits: torch.Tensor) -> tuple[int, ...]:
    flat = int(hits.flatten().nonzero()[0])
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(hits.shape)))


@dataclass
class _Guarded:
    """One output view inside a larger allocation: [guard | view | guard]."""

    name: str
    storage: torch.Tensor  # flat, the whole allocation
    view: torch.Tensor
    guard: int  # guard length in elements, each side
    # Varlen: (rows,) True for the rows of dimension 2 that belong to a sequence. The
    # others are padding between packed sequences: they must keep the poison.
    valid_rows: torch.Tensor | None = None

    @classmethod
    def allocate(cls, name: str, shape: tuple[int, ...], dtype: torch.dtype,
                 device: str | torch.device) -> _Guarded:
        n = 1
        for s in shape:
            n *= s
        guard = GUARD_BYTES // torch.empty((), dtype=dtype).element_size()
        storage = torch.empty(n + 2 * guard, dtype=dtype, device=device)
        view = storage[guard:guard + n].view(shape)
        g = cls(name, storage, view, guard)
        _bits(storage[:guard]).fill_(g._guard_value)
        _bits(storage[guard + n:]).fill_(g._guard_value)
        return g

    @property
    def _poison_value(self) -> int:
        return _signed(POISON_BITS[self.storage.dtype], self.storage.element_size())

    @property
    def _guard_value(self) -> int:
        return _signed(GUARD_BITS[self.storage.dtype], self.storage.element_size())

    def poison(self) -> None:
        _bits(self.view).fill_(self._poison_value)

    def _rows_expanded(self, rows: torch.Tensor) -> torch.Tensor:
        shape = [1] * self.view.dim()
        shape[2] = rows.numel()
        return rows.to(self.view.device).view(shape).expand(self.view.shape)

    def unwritten(self) -> str | None:
        still = _bits(self.view) == self._poison_value
        if self.valid_rows is not None:
            padding = ~self._rows_expanded(self.valid_rows)
            crossed = self._padding_written(still, padding)
            still = still & ~padding
            if crossed:
                return crossed + ("; " + m if (m := self._unwritten_msg(still)) else "")
        return self._unwritten_msg(still)

    def _padding_written(self, still: torch.Tensor, padding: torch.Tensor) -> str | None:
        wrote = padding & ~still
        count = int(wrote.sum())
        if not count:
            return None
        return (f"{self.name}: {count} element(s) written in the padding between packed "
                f"sequences (a write across a sequence boundary), first at index "
                f"{_first_index(wrote)}")

    def _unwritten_msg(self, still: torch.Tensor) -> str | None:
        count = int(still.sum())
        if not count:
            return None
        return (f"{self.name}: {count} of {self.view.numel()} element(s) never written, "
                f"first at index {_first_index(still)}")

    def check_guards(self) -> str | None:
        n = self.view.numel()
        msgs = []
        for side, zone in (("before", self.storage[:self.guard]),
                           ("after", self.storage[self.guard + n:])):
            changed = _bits(zone) != self._guard_value
            count = int(changed.sum())
            if count:
                pos = changed.flatten().nonzero().flatten()
                # Distance from the output's edge, in elements: -1 is the element just
                # before the output, +0 the one just after it.
                first = int(pos[-1]) - self.guard if side == "before" else int(pos[0])
                msgs.append(f"{self.name}: {count} element(s) written {side} the output "
                            f"(nearest at offset {first:+d} elements)")
        return "; ".join(msgs) or None


class _GuardedSet:
    """Several guarded views checked together."""

    def _parts(self) -> list[_Guarded]:
        raise NotImplementedError

    def poison(self) -> None:
        for p in self._parts():
            p.poison()

    def unwritten(self) -> str | None:
        msgs = [m for p in self._parts() if (m := p.unwritten())]
        return "; ".join(msgs) or None

    def check_guards(self) -> str | None:
        msgs = [m for p in self._parts() if (m := p.check_guards())]
        return "; ".join(msgs) or None


class OutputBuffers(_GuardedSet):
    """`out` (B, H, Nq, d) in the case dtype and `lse` (B, H, Nq) float32 (or None)."""

    def __init__(self, out: _Guarded, lse: _Guarded | None) -> None:
        self._out = out
        self._lse = lse

    @classmethod
    def allocate(cls, case: Case, device: str | torch.device, writes_lse: bool) -> OutputBuffers:
        """`out` has q's shape in the case's layout (packed for varlen, whose padding rows
        must stay unwritten: harness.core.serving)."""
        shape = (case.batch, case.heads, case.seqlen_q, case.dv)
        valid = None
        if case.is_serving:
            from harness.core.serving import row_valid, tensor_shapes

            shape, valid = tensor_shapes(case)["out"], row_valid(case)
        out = _Guarded.allocate("out", shape, case.torch_dtype, device)
        out.valid_rows = valid
        lse = None
        if writes_lse:
            lse = _Guarded.allocate("lse", shape[:3], torch.float32, device)
            lse.valid_rows = valid
        bufs = cls(out, lse)
        bufs.poison()
        return bufs

    @property
    def out(self) -> torch.Tensor:
        return self._out.view

    @property
    def lse(self) -> torch.Tensor | None:
        return None if self._lse is None else self._lse.view

    def _parts(self) -> list[_Guarded]:
        return [self._out] + ([self._lse] if self._lse is not None else [])


class GradBuffers(_GuardedSet):
    """The backward's outputs, owned by the harness like the forward's: `dq` (B, H, Nq,
    d), `dk` and `dv` (B, Hkv, Nk, d), in the case dtype, guarded and poisoned."""

    def __init__(self, dq: _Guarded, dk: _Guarded, dv: _Guarded) -> None:
        self._grads = (dq, dk, dv)

    @classmethod
    def allocate(cls, case: Case, device: str | torch.device) -> GradBuffers:
        q_shape = (case.batch, case.heads, case.seqlen_q, case.head_dim)
        kv_shape = (case.batch, case.kv_heads, case.seqlen_k, case.head_dim)
        v_shape = kv_shape[:3] + (case.dv,)
        bufs = cls(*(_Guarded.allocate(name, shape, case.torch_dtype, device)
                     for name, shape in (("dq", q_shape), ("dk", kv_shape),
                                         ("dv", v_shape))))
        bufs.poison()
        return bufs

    @property
    def grads(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dq, dk, dv = self._grads
        return dq.view, dk.view, dv.view

    def _parts(self) -> list[_Guarded]:
        return list(self._grads)


_INPUT_FIELDS = ("q", "k", "v", "mask", "key_lengths", "q_descale", "k_descale", "v_descale",
                 "out", "lse", "dout")


def _input_tensors(inputs: Inputs) -> dict[str, torch.Tensor]:
    """The named input tensors, the serving index's too ("serving.block_table", ...)."""
    named = {f: t for f in _INPUT_FIELDS if (t := getattr(inputs, f, None)) is not None}
    serving = getattr(inputs, "serving", None)
    if serving is not None:
        named.update({f"serving.{k}": t for k, t in serving.tensors().items()})
    return named


@dataclass
class InputSnapshot:
    """Bitwise copies of the inputs taken before a call, to catch a candidate that
    writes into q, k, v or the mask (inputs are shared with the oracle and later calls)."""

    copies: dict[str, torch.Tensor]

    @classmethod
    def take(cls, inputs: Inputs) -> InputSnapshot:
        """Of the forward's `Inputs`, or of a backward's (harness.core.cases.GradInputs:
        also the forward's output, its LSE and dO)."""
        return cls({f: t.clone() for f, t in _input_tensors(inputs).items()})

    def changed(self, inputs: Inputs) -> str | None:
        msgs = []
        now_all = _input_tensors(inputs)
        for f in dict.fromkeys([*self.copies, *now_all]):
            now, before = now_all.get(f), self.copies.get(f)
            if (now is None) != (before is None):
                msgs.append(f"input {f} was replaced")
                continue
            if now is None:
                continue
            if now.shape != before.shape or now.dtype != before.dtype:
                msgs.append(f"input {f} changed shape or dtype")
                continue
            a, b = now, before
            if a.is_floating_point():  # compare bits, so that NaN == NaN and -0 != +0
                a, b = _bits(a), _bits(b)
            diff = a != b
            if bool(diff.any()):
                msgs.append(f"input {f} was modified ({int(diff.sum())} element(s) changed)")
        return "; ".join(msgs) or None
