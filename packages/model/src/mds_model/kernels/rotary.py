"""Fused query/key/value split with rotary positions, forward and backward.

qkv (S, B, groups * (per_group + 2) * head_dim) is one tensor-parallel rank's query_key_value
output, each key/value group's rows [its per_group queries, its key, its value] (upstream's
layout; per_group 1 without grouped-query attention). Out come the queries (B, groups *
per_group, S, head_dim), keys and values (B, groups, S, head_dim), contiguous, the queries and
keys rotated at positions 0..S-1 over their first `rotary_dim` dimensions by rotate-half
(GPT-NeoX's and Hugging Face Llama's): x * cos + cat(-x2, x1) * sin, with cos and sin the
(positions, rotary_dim) tables. The backward rotates the gradients back (the transpose: x2's
share of the first half comes in with +sin, x1's of the second with -sin) and writes them in
qkv's layout. One program per (position, batch row, group): the split, permute, rotation and
their backward copies are one pass each way instead of about ten.

`rotary_qkv_into_cache` is decoding's form (forward only): each row's tokens at their own
positions (B, S), the keys and values written straight into a preallocated cache's slots at those
positions (`decoding.StaticKVCache`), the queries returned.
"""

import torch

from ._common import check_kernel_device, num_warps_for


def rotate_half_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (..., S, head_dim) rotated over its first cos.shape[-1] dimensions; cos and sin (S, r),
    or any shape broadcasting to x's first r dimensions (per-row positions: (B, 1, S, r))."""
    rotary_dim = cos.shape[-1]
    head, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated = torch.cat((-head[..., half:], head[..., :half]), dim=-1)
    head = head * cos.to(x.dtype) + rotated * sin.to(x.dtype)
    return torch.cat((head, rest), dim=-1) if rest.shape[-1] else head


def rotary_qkv_reference(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    groups: int,
    per_group: int,
    head_dim: int,
):
    """Pure-torch split and rotation (the CPU path and the tests' oracle)."""
    seq, batch = qkv.shape[:2]
    qkv = qkv.view(seq, batch, groups, per_group + 2, head_dim)
    q, k, v = qkv.split([per_group, 1, 1], dim=3)
    q = q.reshape(seq, batch, groups * per_group, head_dim).permute(1, 2, 0, 3)
    k, v = (t.squeeze(3).permute(1, 2, 0, 3) for t in (k, v))
    cos, sin = cos[:seq], sin[:seq]
    return rotate_half_reference(q, cos, sin), rotate_half_reference(k, cos, sin), v


def rotary_qkv_into_cache_reference(
    qkv, cos, sin, positions, keys, values, *, groups: int, per_group: int, head_dim: int
) -> torch.Tensor:
    """Pure-torch `rotary_qkv_into_cache`: the split, the rotation at per-row positions (as
    `RotaryEmbedding.at`) and one scatter of keys and values into their slots."""
    seq, batch = qkv.shape[:2]
    qkv = qkv.view(seq, batch, groups, per_group + 2, head_dim)
    q, k, v = qkv.split([per_group, 1, 1], dim=3)
    q = q.reshape(seq, batch, groups * per_group, head_dim).permute(1, 2, 0, 3)
    k, v = (t.squeeze(3).permute(1, 2, 0, 3) for t in (k, v))  # (B, groups, S, hd)
    cos, sin = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)  # (B, 1, S, r)
    k = rotate_half_reference(k, cos, sin)
    index = positions[:, None, :, None].expand(k.shape)
    keys.scatter_(2, index, k.to(keys.dtype))
    values.scatter_(2, index, v.to(values.dtype))
    return rotate_half_reference(q, cos, sin)


try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs run the reference
    triton = None

if triton is not None:

    @triton.jit
    def _rotary_qkv_kernel(
        src,  # forward: qkv; backward: dqkv (written)
        q,
        k,
        v,
        cos,
        sin,
        positions,  # (B, S) int64 with AT_POSITIONS, else unread
        batch,
        seq,
        groups,
        kv_len,  # the keys' and values' sequence length: S, or a cache's slots
        stride_s,
        stride_b,
        PER_GROUP: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        ROTARY_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_G: tl.constexpr,  # groups per program
        BACKWARD: tl.constexpr,
        AT_POSITIONS: tl.constexpr,
        Q_SEQ_MAJOR: tl.constexpr,  # q (S, B, heads, hd) in memory, else (B, heads, S, hd)
    ):
        row = tl.program_id(0)  # s * batch + b
        g = tl.program_id(1) * BLOCK_G + tl.arange(0, BLOCK_G)[:, None]  # (BLOCK_G, 1)
        s = row // batch
        b = row % batch
        # the position's table row, and the key/value slot (per-row positions: a cache's)
        if AT_POSITIONS:
            p = tl.load(positions + b * seq + s)
        else:
            p = s
        d = tl.arange(0, BLOCK_D)
        half = ROTARY_DIM // 2
        rotated = d < ROTARY_DIM
        # rotate-half's partner of each dimension and its sign: cat(-x2, x1)
        partner = tl.where(d < half, d + half, d - half)[None, :]
        sign = tl.where(d < half, -1.0, 1.0)[None, :]
        c = tl.load(cos + p * ROTARY_DIM + d, mask=rotated, other=1.0)[None, :]
        sn = tl.load(sin + p * ROTARY_DIM + d, mask=rotated, other=0.0)[None, :]
        sn_partner = tl.load(sin + p * ROTARY_DIM + partner, mask=rotated[None, :], other=0.0)
        in_head = (g < groups) & (d < HEAD_DIM)[None, :]
        in_rotary = (g < groups) & rotated[None, :]
        rotated = rotated[None, :]
        d = d[None, :]
        base = src + s * stride_s + b * stride_b + g * ((PER_GROUP + 2) * HEAD_DIM)
        heads = groups * PER_GROUP
        for j in tl.static_range(PER_GROUP + 2):
            if j < PER_GROUP and Q_SEQ_MAJOR:  # a query head
                dst = q + (row * heads + g * PER_GROUP + j) * HEAD_DIM
            elif j < PER_GROUP:
                dst = q + ((b * heads + g * PER_GROUP + j) * seq + s) * HEAD_DIM
            elif j == PER_GROUP:
                dst = k + ((b * groups + g) * kv_len + p) * HEAD_DIM
            else:
                dst = v + ((b * groups + g) * kv_len + p) * HEAD_DIM
            if BACKWARD:
                dy = tl.load(dst + d, mask=in_head, other=0.0).to(tl.float32)
                if j <= PER_GROUP:
                    # the transpose of y = x c + sign(d) x[partner] s[d]: x[d] gets dy[d] c[d]
                    # and dy[partner] s[partner] with the partner's sign, which is -sign(d)
                    dy_partner = tl.load(dst + partner, mask=in_rotary, other=0.0).to(tl.float32)
                    dx = dy * c - sign * dy_partner * sn_partner
                    dx = tl.where(rotated, dx, dy)
                else:
                    dx = dy
                tl.store(base + j * HEAD_DIM + d, dx.to(src.dtype.element_ty), mask=in_head)
            else:
                x = tl.load(base + j * HEAD_DIM + d, mask=in_head, other=0.0).to(tl.float32)
                if j <= PER_GROUP:
                    x_partner = tl.load(
                        base + j * HEAD_DIM + partner, mask=in_rotary, other=0.0
                    ).to(tl.float32)
                    y = tl.where(rotated, x * c + sign * x_partner * sn, x)
                else:
                    y = x
                tl.store(dst + d, y.to(dst.dtype.element_ty), mask=in_head)


# Up to 8 groups' heads per program, about 32 elements a thread: at the Llama 3B shape (8 groups,
# head_dim 128, micro-batch 15) 160 us a call on an H200 against 213 us at one group per program
# and two warps.
_MAX_GROUPS_PER_PROGRAM = 8


def _launch(
    src,
    q,
    k,
    v,
    cos,
    sin,
    *,
    groups,
    per_group,
    head_dim,
    backward: bool,
    positions=None,
    q_seq_major: bool = False,
) -> None:
    """positions (B, S) contiguous: rotate at them and write k and v (B, groups, slots, hd) at
    those slots (forward only); None: positions 0..S-1, k and v (B, groups, S, hd). q is laid out
    (S, B, heads, hd) with `q_seq_major`, else (B, heads, S, hd)."""
    seq, batch = src.shape[:2]
    rotary_dim = cos.shape[-1]
    block_g = min(_MAX_GROUPS_PER_PROGRAM, triton.next_power_of_2(groups))
    block_d = triton.next_power_of_2(head_dim)
    _rotary_qkv_kernel[(seq * batch, triton.cdiv(groups, block_g))](
        src,
        q,
        k,
        v,
        cos,
        sin,
        src if positions is None else positions,  # unread without AT_POSITIONS
        batch,
        seq,
        groups,
        seq if positions is None else k.shape[2],
        src.stride(0),
        src.stride(1),
        PER_GROUP=per_group,
        HEAD_DIM=head_dim,
        ROTARY_DIM=rotary_dim,
        BLOCK_D=block_d,
        BLOCK_G=block_g,
        BACKWARD=backward,
        AT_POSITIONS=positions is not None,
        Q_SEQ_MAJOR=q_seq_major,
        num_warps=num_warps_for(block_g * block_d, elem_per_thread=32),
    )


class RotaryQKVFunction(torch.autograd.Function):
    """The Triton split and rotation; saves only the tables (the backward needs no activation).

    The queries are a (B, heads, S, hd) view of an (S, B, heads, hd) tensor: cuDNN's attention
    gives its output the queries' layout, so the output projection reads (S, B, H) from it as it
    is (with (B, heads, S, hd) queries a transposing copy per layer: 8.7 ms of a Llama 3B step at
    micro-batch 15), and each row's heads are written side by side."""

    @staticmethod
    def forward(ctx, qkv, cos, sin, groups: int, per_group: int, head_dim: int):
        seq, batch = qkv.shape[:2]
        if qkv.stride(2) != 1:
            qkv = qkv.contiguous()
        options = dict(dtype=qkv.dtype, device=qkv.device)
        q = torch.empty((seq, batch, groups * per_group, head_dim), **options)
        k = torch.empty((batch, groups, seq, head_dim), **options)
        v = torch.empty((batch, groups, seq, head_dim), **options)
        cos, sin = cos[:seq].contiguous(), sin[:seq].contiguous()
        _launch(qkv, q, k, v, cos, sin, groups=groups, per_group=per_group, head_dim=head_dim,
                backward=False, q_seq_major=True)  # fmt: skip
        ctx.save_for_backward(cos, sin)
        ctx.shape, ctx.layout = qkv.shape, (groups, per_group, head_dim)
        return q.permute(1, 2, 0, 3), k, v

    @staticmethod
    def backward(ctx, dq, dk, dv):
        cos, sin = ctx.saved_tensors
        groups, per_group, head_dim = ctx.layout
        dq = dq.permute(2, 0, 1, 3).contiguous()  # no copy where attention kept the layout
        dk, dv = dk.contiguous(), dv.contiguous()
        dqkv = torch.empty(ctx.shape, dtype=dq.dtype, device=dq.device)
        _launch(dqkv, dq, dk, dv, cos, sin, groups=groups, per_group=per_group,
                head_dim=head_dim, backward=True, q_seq_major=True)  # fmt: skip
        return dqkv, None, None, None, None, None


def rotary_qkv(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    groups: int,
    per_group: int,
    head_dim: int,
    use_kernel: bool,
):
    """qkv (S, B, groups * (per_group + 2) * head_dim) -> q (B, groups * per_group, S, hd), k
    and v (B, groups, S, hd), q and k rotated at positions 0..S-1 by the (positions, rotary_dim)
    fp32 tables cos and sin (rotary_dim even, at most head_dim); differentiable in qkv. The
    kernel's q is a view of an (S, B, heads, hd) tensor (RotaryQKVFunction)."""
    seq = qkv.shape[0]
    width = groups * (per_group + 2) * head_dim
    rotary_dim = cos.shape[-1]
    if qkv.dim() != 3 or qkv.shape[-1] != width:
        raise ValueError(
            f"rotary_qkv: qkv must be (S, B, {width}) for {groups} groups of {per_group} queries "
            f"+ key + value of {head_dim}, got {tuple(qkv.shape)}"
        )
    if rotary_dim % 2 or rotary_dim > head_dim or cos.shape[0] < seq or sin.shape != cos.shape:
        raise ValueError(
            f"rotary_qkv: cos and sin must be (>= {seq}, an even rotary dim <= {head_dim}), got "
            f"{tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    if not use_kernel:
        return rotary_qkv_reference(
            qkv, cos, sin, groups=groups, per_group=per_group, head_dim=head_dim
        )
    check_kernel_device(qkv, cos, sin, name="rotary_qkv")
    return RotaryQKVFunction.apply(qkv, cos.float(), sin.float(), groups, per_group, head_dim)


def rotary_qkv_into_cache(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    *,
    groups: int,
    per_group: int,
    head_dim: int,
    use_kernel: bool,
) -> torch.Tensor:
    """Decoding's split and rotation: qkv (S, B, groups * (per_group + 2) * head_dim) of tokens at
    per-row positions (B, S) -> the rotated queries (B, groups * per_group, S, hd); the rotated
    keys and the values are written into keys and values (B, groups, slots, hd), contiguous
    (a `StaticLayerCache`'s halves), at slots `positions` (every position < slots, not checked:
    that would wait on the device), in their dtype. cos and sin: the (>= slots, rotary_dim) fp32
    tables. Forward only (inference)."""
    seq, batch = qkv.shape[:2]
    _check_step_shapes(
        "rotary_qkv_into_cache", qkv, positions, keys, values,
        groups=groups, per_group=per_group, head_dim=head_dim, one_token=False,
    )  # fmt: skip
    if not use_kernel:
        return rotary_qkv_into_cache_reference(
            qkv, cos, sin, positions, keys, values,
            groups=groups, per_group=per_group, head_dim=head_dim,
        )  # fmt: skip
    check_kernel_device(qkv, cos, sin, positions, keys, values, name="rotary_qkv_into_cache")
    if not (keys.is_contiguous() and values.is_contiguous()):
        raise ValueError("rotary_qkv_into_cache: the kernel writes contiguous keys and values")
    if qkv.stride(2) != 1:
        qkv = qkv.contiguous()
    q = torch.empty((batch, groups * per_group, seq, head_dim), dtype=qkv.dtype, device=qkv.device)
    _launch(qkv, q, keys, values, cos.float().contiguous(), sin.float().contiguous(),
            groups=groups, per_group=per_group, head_dim=head_dim, backward=False,
            positions=positions.contiguous())  # fmt: skip
    return q


def _check_step_shapes(
    name, qkv, positions, keys, values, *, groups, per_group, head_dim, one_token: bool
) -> None:
    """A decoding step's inputs, as `rotary_qkv_into_cache` and `attend_one_token` take them:
    qkv (S, B, groups * (per_group + 2) * head_dim) (S = 1 for one token), positions (B, S),
    the cache's halves (B, groups, slots, hd); ValueError naming the function otherwise."""
    seq, batch = qkv.shape[:2]
    rows = "1" if one_token else "S"
    width = groups * (per_group + 2) * head_dim
    cache_shape = (batch, groups, keys.shape[2] if keys.dim() == 4 else -1, head_dim)
    if (
        (one_token and seq != 1)
        or qkv.dim() != 3
        or qkv.shape[-1] != width
        or positions.shape != (batch, seq)
    ):
        raise ValueError(
            f"{name}: qkv must be ({rows}, B, {width}) for {groups} groups of {per_group} "
            f"queries + key + value of {head_dim}, and positions (B, {rows}); got "
            f"{tuple(qkv.shape)} and {tuple(positions.shape)}"
        )
    if keys.shape != cache_shape or values.shape != cache_shape:
        raise ValueError(
            f"{name}: keys and values must be (B {batch}, groups {groups}, slots, "
            f"{head_dim}), got {tuple(keys.shape)} and {tuple(values.shape)}"
        )


def attend_one_token_reference(
    qkv, cos, sin, positions, keys, values, *, groups: int, per_group: int, head_dim: int
) -> torch.Tensor:
    """Pure-torch `attend_one_token`: `rotary_qkv_into_cache` (cos None: the split and the
    scatter alone), then each query over its row's slots 0..position (softmax in fp32, the
    default 1/sqrt(head_dim) scale) -> the context (1, B, groups * per_group * head_dim)."""
    batch = qkv.shape[1]
    if cos is not None:
        q = rotary_qkv_into_cache_reference(
            qkv, cos, sin, positions, keys, values,
            groups=groups, per_group=per_group, head_dim=head_dim,
        )  # fmt: skip
    else:
        split = qkv.view(1, batch, groups, per_group + 2, head_dim)
        q = split[:, :, :, :per_group].reshape(1, batch, groups * per_group, head_dim)
        q = q.permute(1, 2, 0, 3)
        index = positions[:, None, :, None].expand(batch, groups, 1, head_dim)
        keys.scatter_(2, index, split[:, :, :, per_group].permute(1, 2, 0, 3).to(keys.dtype))
        values.scatter_(
            2, index, split[:, :, :, per_group + 1].permute(1, 2, 0, 3).to(values.dtype)
        )
    q = q.to(keys.dtype).reshape(batch, groups, per_group, head_dim)  # a group's heads as rows
    scores = torch.matmul(q.float(), keys.float().transpose(-1, -2)) / head_dim**0.5
    slots = torch.arange(keys.shape[2], device=keys.device)
    unseen = slots.view(1, 1, 1, -1) > positions.view(batch, 1, 1, 1)
    probs = torch.softmax(scores.masked_fill(unseen, float("-inf")), dim=-1)
    context = torch.matmul(probs, values.float()).to(qkv.dtype)  # (B, groups, per_group, hd)
    return context.reshape(1, batch, groups * per_group * head_dim)


if triton is not None:

    @triton.jit
    def _attend_one_token_kernel(
        qkv,
        cos,
        sin,
        positions,  # (B,) int64
        keys,  # (B, groups, slots, hd) contiguous, written at each row's position
        values,
        out,  # (B, groups * PER_GROUP * hd) contiguous
        groups,
        slots,
        stride_b,
        scale,
        PER_GROUP: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        ROTARY_DIM: tl.constexpr,  # 0: no rotation
        BLOCK_H: tl.constexpr,  # >= PER_GROUP and >= 16 (tl.dot's least rows)
        BLOCK_D: tl.constexpr,
        BLOCK_S: tl.constexpr,
        PRECISION: tl.constexpr,  # tl.dot's: "ieee" for an fp32 cache, else "tf32"
    ):
        # One program per (row, group): the group's queries are the rows of one product over
        # its keys (grouped-query attention without repeating them). The new key and value go
        # into the cache and count from registers; the loop reads the slots before them.
        b = tl.program_id(0).to(tl.int64)
        g = tl.program_id(1)
        p = tl.load(positions + b)
        d = tl.arange(0, BLOCK_D)
        h = tl.arange(0, BLOCK_H)
        in_head = d < HEAD_DIM
        q_ok = (h < PER_GROUP)[:, None] & in_head[None, :]
        base = qkv + b * stride_b + g * (PER_GROUP + 2) * HEAD_DIM
        q_at = base + h[:, None] * HEAD_DIM + d[None, :]
        q = tl.load(q_at, mask=q_ok, other=0.0).to(tl.float32)
        k = tl.load(base + PER_GROUP * HEAD_DIM + d, mask=in_head, other=0.0).to(tl.float32)
        v = tl.load(base + (PER_GROUP + 1) * HEAD_DIM + d, mask=in_head, other=0.0)
        dtype = keys.dtype.element_ty
        if ROTARY_DIM > 0:  # rotate-half as _rotary_qkv_kernel: fp32, rounded once
            half = ROTARY_DIM // 2
            rotated = d < ROTARY_DIM
            partner = tl.where(d < half, d + half, d - half)
            sign = tl.where(d < half, -1.0, 1.0)
            c = tl.load(cos + p * ROTARY_DIM + d, mask=rotated, other=1.0)
            sn = tl.load(sin + p * ROTARY_DIM + d, mask=rotated, other=0.0)
            q_partner = tl.load(
                base + h[:, None] * HEAD_DIM + partner[None, :],
                mask=q_ok & rotated[None, :],
                other=0.0,
            ).to(tl.float32)
            q = tl.where(rotated[None, :], q * c[None, :] + (sign * sn)[None, :] * q_partner, q)
            k_partner = tl.load(base + PER_GROUP * HEAD_DIM + partner, mask=rotated, other=0.0).to(
                tl.float32
            )
            k = tl.where(rotated, k * c + sign * k_partner * sn, k)
        q_low = q.to(dtype)
        k_low = k.to(dtype)
        v_low = v.to(dtype)
        cache_row = ((b * groups + g) * slots) * HEAD_DIM
        tl.store(keys + cache_row + p * HEAD_DIM + d, k_low, mask=in_head)
        tl.store(values + cache_row + p * HEAD_DIM + d, v_low, mask=in_head)
        q = q_low.to(tl.float32)
        # the new slot first: m its score, its weight 1 the softmax's sum, acc its value
        m = tl.sum(q * k_low.to(tl.float32)[None, :], axis=1) * scale  # (BLOCK_H,)
        total = tl.full((BLOCK_H,), 1.0, tl.float32)
        acc = tl.zeros((BLOCK_H, BLOCK_D), tl.float32) + v_low.to(tl.float32)[None, :]
        s = tl.arange(0, BLOCK_S)
        for start in range(0, p, BLOCK_S):
            seen = start + s < p
            at = cache_row + (start + s)[:, None] * HEAD_DIM + d[None, :]
            kv_ok = seen[:, None] & in_head[None, :]
            kb = tl.load(keys + at, mask=kv_ok, other=0.0).to(tl.float32)
            # fp32 operands: half-precision keys and queries are exact in TF32
            scores = tl.dot(q, tl.trans(kb), input_precision=PRECISION)
            scores = tl.where(seen[None, :], scores * scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            alpha = tl.exp(m - m_new)
            probs = tl.exp(scores - m_new[:, None])
            total = total * alpha + tl.sum(probs, axis=1)
            vb = tl.load(values + at, mask=kv_ok, other=0.0).to(tl.float32)
            # the probabilities in the cache's precision, as flash attention's and SDPA's
            # half-precision kernels round them before the product with the values
            probs_low = probs.to(dtype).to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(probs_low, vb, input_precision=PRECISION)
            m = m_new
        context = acc / total[:, None]
        heads = groups * PER_GROUP
        dst = out + b * heads * HEAD_DIM + (g * PER_GROUP + h[:, None]) * HEAD_DIM + d[None, :]
        tl.store(dst, context.to(out.dtype.element_ty), mask=q_ok)


def attend_one_token(
    qkv: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    positions: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    *,
    groups: int,
    per_group: int,
    head_dim: int,
    use_kernel: bool,
) -> torch.Tensor:
    """A decoding step's attention for one token per row, in one kernel: qkv (1, B, groups *
    (per_group + 2) * head_dim) at per-row positions (B, 1) -> the context (1, B, groups *
    per_group * head_dim), the output projection's input. As `rotary_qkv_into_cache` (cos and
    sin None: no rotation), the keys and values are written into the cache's halves keys and
    values (B, groups, slots, hd) at each row's position; then each query attends to its row's
    slots 0..position (causal, the default 1/sqrt(head_dim) scale, no dropout), a group's
    queries as the rows of one product over the group's keys. Forward only (inference)."""
    batch = qkv.shape[1]
    _check_step_shapes(
        "attend_one_token", qkv, positions, keys, values,
        groups=groups, per_group=per_group, head_dim=head_dim, one_token=True,
    )  # fmt: skip
    if not use_kernel:
        return attend_one_token_reference(
            qkv, cos, sin, positions, keys, values,
            groups=groups, per_group=per_group, head_dim=head_dim,
        )  # fmt: skip
    tables = () if cos is None else (cos, sin)
    check_kernel_device(qkv, positions, keys, values, *tables, name="attend_one_token")
    if not (keys.is_contiguous() and values.is_contiguous()):
        raise ValueError("attend_one_token: the kernel writes contiguous keys and values")
    if qkv.stride(2) != 1:
        qkv = qkv.contiguous()
    if cos is not None:
        cos, sin = cos.float().contiguous(), sin.float().contiguous()
    out = torch.empty((1, batch, groups * per_group * head_dim), dtype=qkv.dtype, device=qkv.device)
    _attend_one_token_kernel[(batch, groups)](
        qkv,
        qkv if cos is None else cos,  # unread without rotation
        qkv if sin is None else sin,
        positions.reshape(batch).contiguous(),
        keys,
        values,
        out,
        groups,
        keys.shape[2],
        qkv.stride(1),
        head_dim**-0.5,
        PER_GROUP=per_group,
        HEAD_DIM=head_dim,
        ROTARY_DIM=0 if cos is None else cos.shape[-1],
        BLOCK_H=max(16, triton.next_power_of_2(per_group)),
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_S=64,
        PRECISION="ieee" if keys.dtype == torch.float32 else "tf32",
        num_warps=4,
    )
    return out
