"""Weight quantizers for the released DeepSeek-V4.1 storage formats (our own code; the formats
are described in docs/MODEL.md section 7 and /work/shared/notes §C.4).

Scales are powers of two stored as float8_e8m0fnu ("ue8m0"): s = 2^ceil(log2(amax / max_code)).
"""

import torch

FP8_MAX = 448.0
E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
E2M1_TABLE = torch.cat([E2M1_GRID, -E2M1_GRID])


def pow2_ceil(x: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2(x)) for x > 0, exact (frexp gives x = m * 2^e with m in [0.5, 1))."""
    m, e = torch.frexp(x.float())
    return torch.ldexp(torch.ones_like(m), e - (m == 0.5).to(e.dtype))


def _e8m0(s: torch.Tensor) -> torch.Tensor:
    return s.float().to(torch.float8_e8m0fnu)


def quant_fp8_blocks(w: torch.Tensor, block: int = 32):
    """[out, in] -> (e4m3 [out, in], e8m0 scales [ceil(out/32), ceil(in/32)]) per 32x32 block."""
    out_f, in_f = w.shape
    bo, bi = -(-out_f // block), -(-in_f // block)
    padded = torch.zeros(bo * block, bi * block)
    padded[:out_f, :in_f] = w
    amax = padded.view(bo, block, bi, block).abs().amax(dim=(1, 3)).clamp_min(2.0**-100)
    s = pow2_ceil(amax / FP8_MAX)
    s_full = s.repeat_interleave(block, 0).repeat_interleave(block, 1)[:out_f, :in_f]
    q = (w / s_full).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, _e8m0(s)


def dequant_fp8_blocks(q: torch.Tensor, s: torch.Tensor, block: int = 32) -> torch.Tensor:
    out_f, in_f = q.shape
    s_full = s.float().repeat_interleave(block, 0).repeat_interleave(block, 1)[:out_f, :in_f]
    return q.float() * s_full


def quant_fp8_rows(w: torch.Tensor, block: int = 32):
    """[rows, dim] -> (e4m3, e8m0 [rows, dim/32]): one scale per 32 channels of each row."""
    rows, dim = w.shape
    g = w.view(rows, dim // block, block)
    s = pow2_ceil(g.abs().amax(-1).clamp_min(2.0**-100) / FP8_MAX)
    q = (g / s.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(rows, dim)
    return q, _e8m0(s)


def dequant_fp8_rows(q: torch.Tensor, s: torch.Tensor, block: int = 32) -> torch.Tensor:
    rows, dim = q.shape
    return (q.float().view(rows, dim // block, block) * s.float().unsqueeze(-1)).view(rows, dim)


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """Round |v| <= 6 to the e2m1 grid, ties to the even code; 4-bit codes, sign in bit 3."""
    a = v.abs()
    lo = (a.unsqueeze(-1) >= E2M1_GRID).sum(-1) - 1  # index of the largest grid point <= a
    hi = (lo + 1).clamp(max=7)
    d_lo = a - E2M1_GRID[lo]
    d_hi = E2M1_GRID[hi] - a
    up = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0) & (hi != lo))
    code = torch.where(up, hi, lo).to(torch.uint8)
    return code | (torch.signbit(v).to(torch.uint8) << 3)


def quant_fp4_rows(w: torch.Tensor, block: int = 32):
    """[out, in] -> (4-bit codes uint8 [out, in], e8m0 scales [out, in/32])."""
    out_f, in_f = w.shape
    g = w.view(out_f, in_f // block, block)
    s = pow2_ceil(g.abs().amax(-1).clamp_min(2.0**-100) / 6.0)
    codes = e2m1_codes((g / s.unsqueeze(-1)).clamp(-6.0, 6.0)).view(out_f, in_f)
    return codes, _e8m0(s)


def dequant_fp4_rows(codes: torch.Tensor, s: torch.Tensor, block: int = 32) -> torch.Tensor:
    out_f, in_f = codes.shape
    v = E2M1_TABLE[codes.long()].view(out_f, in_f // block, block)
    return (v * s.float().unsqueeze(-1)).view(out_f, in_f)
