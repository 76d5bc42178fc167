"""Attention in float64 with numpy, written from docs/semantics.md and sharing
no code with cuflash: the oracle of the Python tests (forward and backward,
dense, varlen and KV-cache layouts, every option)."""

import numpy as np


def _visible(lq, lk, causal, window):
    left, right = window
    if causal:
        right = 0
    offset = lk - lq
    i = np.arange(lq)[:, None]
    j = np.arange(lk)[None, :]
    mask = np.ones((lq, lk), dtype=bool)
    if right >= 0:
        mask &= j <= i + offset + right
    if left >= 0:
        mask &= j >= i + offset - left
    return mask


def attend_sequence(q, k, v, *, scale=None, causal=False, window=(-1, -1), softcap=0.0, slopes=None, dout=None):
    """One sequence: q [Lq, Hq, D], k/v [Lk, Hk, D] -> out [Lq, Hq, D], lse [Hq, Lq]
    (and with dout [Lq, Hq, D]: dq [Lq, Hq, D], dk/dv [Lk, Hk, D])."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    lq, hq, d = q.shape
    lk, hk, _ = k.shape
    group = hq // hk
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    kh = np.repeat(k, group, axis=1).transpose(1, 0, 2)  # [Hq, Lk, D]
    vh = np.repeat(v, group, axis=1).transpose(1, 0, 2)
    qh = q.transpose(1, 0, 2)  # [Hq, Lq, D]
    raw = scale * qh @ kh.transpose(0, 2, 1)  # [Hq, Lq, Lk]
    s = softcap * np.tanh(raw / softcap) if softcap > 0 else raw.copy()
    if slopes is not None:
        distance = np.abs(np.arange(lq)[:, None] + (lk - lq) - np.arange(lk)[None, :])
        s = s - np.asarray(slopes, dtype=np.float64)[:, None, None] * distance[None]
    mask = _visible(lq, lk, causal, window)[None]
    s = np.where(mask, s, -np.inf)
    row_max = s.max(axis=-1, keepdims=True) if lk else np.full((hq, lq, 1), -np.inf)
    safe_max = np.where(np.isfinite(row_max), row_max, 0.0)
    e = np.where(mask, np.exp(s - safe_max), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(total > 0, np.log(total) + safe_max, -np.inf)[..., 0]
        p = np.where(total > 0, e / total, 0.0)
    out = (p @ vh).transpose(1, 0, 2)
    if dout is None:
        return out, lse
    do = np.asarray(dout, dtype=np.float64).transpose(1, 0, 2)  # [Hq, Lq, D]
    dp = do @ vh.transpose(0, 2, 1)
    delta = (do * out.transpose(1, 0, 2)).sum(axis=-1, keepdims=True)
    ds = p * (dp - delta)
    if softcap > 0:
        ds = ds * (1.0 - np.tanh(raw / softcap) ** 2)
    dq = (scale * ds @ kh).transpose(1, 0, 2)
    dk_h = scale * ds.transpose(0, 2, 1) @ qh  # [Hq, Lk, D]
    dv_h = p.transpose(0, 2, 1) @ do
    dk = dk_h.reshape(hk, group, lk, d).sum(axis=1).transpose(1, 0, 2)
    dv = dv_h.reshape(hk, group, lk, d).sum(axis=1).transpose(1, 0, 2)
    return out, lse, dq, dk, dv


def _slopes_for(alibi, b):
    if alibi is None:
        return None
    alibi = np.asarray(alibi)
    return alibi if alibi.ndim == 1 else alibi[b]


def dense(q, k, v, dout=None, alibi=None, **options):
    """q [B, Sq, Hq, D], k/v [B, Sk, Hk, D] -> out, lse [B, Hq, Sq] (, dq, dk, dv)."""
    results = [attend_sequence(q[b], k[b], v[b], slopes=_slopes_for(alibi, b),
                               dout=None if dout is None else dout[b], **options) for b in range(q.shape[0])]
    return tuple(np.stack([r[i] for r in results]) for i in range(len(results[0])))


def varlen(q, k, v, cu_q, cu_k, dout=None, alibi=None, **options):
    """Packed q [Tq, Hq, D], k/v [Tk, Hk, D] -> out (zeros past cu_q[-1]), lse [Hq, Tq] (, dq, dk, dv)."""
    out = np.zeros(q.shape)
    lse = np.zeros((q.shape[1], q.shape[0]))
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for b in range(len(cu_q) - 1):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        r = attend_sequence(q[qs], k[ks], v[ks], slopes=_slopes_for(alibi, b),
                            dout=None if dout is None else dout[qs], **options)
        out[qs], lse[:, qs] = r[0], r[1]
        if dout is not None:
            dq[qs], dk[ks], dv[ks] = r[2], r[3], r[4]
    return (out, lse) if dout is None else (out, lse, dq, dk, dv)


def paged_varlen(q, k_cache, v_cache, cu_q, cu_k, block_table, alibi=None, **options):
    """Packed q [Tq, Hq, D] over keys in a paged cache [num_pages, page_size, Hk, D]: sequence b's
    cu_k[b+1] - cu_k[b] keys are cache positions 0.. of block_table[b] (flash-attn's paged prefill)
    -> out (zeros past cu_q[-1]), lse [Hq, Tq]."""
    page_size = k_cache.shape[1]
    rows, cols = zip(*(cache_positions(b, cu_k[b + 1] - cu_k[b], page_size, block_table)
                       for b in range(len(cu_k) - 1)))
    rows, cols = np.concatenate(rows).astype(np.int64), np.concatenate(cols).astype(np.int64)
    return varlen(q, np.asarray(k_cache)[rows, cols], np.asarray(v_cache)[rows, cols], cu_q, cu_k, alibi=alibi,
                  **options)


def cache_positions(b, length, page_size, block_table):
    """Indices into the cache's first two dims of sequence b's keys 0..length-1."""
    j = np.arange(length)
    if block_table is None:
        return np.full(length, b), j
    return np.asarray(block_table)[b, j // page_size], j % page_size


def kvcache(q, k_cache, v_cache, seqlens, block_table=None, k_new=None, v_new=None, alibi=None, **options):
    """q [B, Sq, Hq, D] over a (paged) cache with optional append -> out, lse, k_cache', v_cache'."""
    k_cache, v_cache = np.array(k_cache, dtype=np.float64), np.array(v_cache, dtype=np.float64)
    page_size = k_cache.shape[1]
    outs, lses = [], []
    for b in range(q.shape[0]):
        cached = int(seqlens[b])
        total = cached + (0 if k_new is None else k_new.shape[1])
        rows, cols = cache_positions(b, total, page_size, block_table)
        if k_new is not None:
            k_cache[rows[cached:], cols[cached:]] = k_new[b]
            v_cache[rows[cached:], cols[cached:]] = v_new[b]
        out, lse = attend_sequence(q[b], k_cache[rows, cols], v_cache[rows, cols], slopes=_slopes_for(alibi, b),
                                   **options)
        outs.append(out)
        lses.append(lse)
    return np.stack(outs), np.stack(lses), k_cache, v_cache


def merge(out_a, lse_a, out_b, lse_b):
    """merge_states in float64: out [B, S, H, D], lse [B, H, S]."""
    lse_a, lse_b = np.asarray(lse_a, np.float64), np.asarray(lse_b, np.float64)
    top = np.maximum(lse_a, lse_b)
    safe = np.where(np.isfinite(top), top, 0.0)
    wa, wb = np.exp(lse_a - safe), np.exp(lse_b - safe)
    total = wa + wb
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(total > 0, np.log(total) + safe, -np.inf)
        wa, wb = np.where(total > 0, wa / total, 0.0), np.where(total > 0, wb / total, 0.0)
    to_rows = lambda w: w.transpose(0, 2, 1)[..., None]  # [B, H, S] -> [B, S, H, 1]
    return to_rows(wa) * out_a + to_rows(wb) * out_b, lse


def rel_l2(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    norm = np.linalg.norm(want)
    return np.linalg.norm(got - want) / (norm if norm > 0 else 1.0)


def max_abs(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    both_inf = np.isinf(got) & np.isinf(want) & (np.sign(got) == np.sign(want))
    with np.errstate(invalid="ignore"):
        diff = np.where(both_inf, 0.0, np.abs(got - want))
    return float(np.nanmax(np.where(np.isnan(diff), np.inf, diff))) if diff.size else 0.0
