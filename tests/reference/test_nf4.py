"""plait's NF4 storage (wrap/lora/nf4.h, QLoRA's frozen base) against
bitsandbytes' own: for the same weight, plait's packed codes and block maxima
equal those of bitsandbytes.functional.quantize_4bit(w, blocksize=64,
quant_type="nf4") byte for byte, with compress_statistics off and on (then the
8-bit codes of the maxima, their per-256 scales and the offset too), for fp32
and bf16 weights, one of them with a last, shorter block; and the dequantized
weight equals dequantize_4bit's exactly (the same fp32 products, rounded once
to the weight's dtype). All on the CPU, bitsandbytes' CPU backend."""

import pytest
import torch
from safetensors.torch import load_file, save_file

import bitsandbytes.functional as bnb
from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
from bitsandbytes.backends.utils import _get_4bit_code

import harness

# name: (shape, dtype); 3 x 45 = 135 elements: two blocks of 64 and one of 7.
# 640 x 96 gives 960 block maxima, so double quantization has 4 blocks of
# them, the last one shorter.
CASES = {
    "fp32_matrix": ((640, 96), torch.float32),
    "bf16_matrix": ((128, 64), torch.bfloat16),
    "fp32_tail": ((3, 45), torch.float32),
    # Over a million elements, which plait dequantizes in chunks; an odd count.
    "fp32_chunks": ((1025, 1025), torch.float32),
}


def generic_dequantize_4bit(packed, state):
    """dequantize_4bit through bitsandbytes' generic kernel (backends/default,
    its CUDA kernel's formula). Its CPU kernel (AVX-512) indexes the block
    maxima by rows and gives other values where a row is not whole blocks
    (640 x 96 here): a bug of that kernel, checked against where it holds."""
    absmax = state.absmax
    if state.nested:
        absmax = bnb.dequantize_blockwise(state.absmax, state.state2) + state.offset
    return _dequantize_4bit_compute(packed.reshape(-1), absmax,
                                    _get_4bit_code("nf4", packed.device), 64,
                                    state.shape, state.dtype)


def nf4_case(tmp_path):
    """Each case's weight, seeded, ~N(0, 0.02) as a trained layer's with a few
    outliers, saved as tmp_path/weights.safetensors; plait's results."""
    generator = torch.Generator().manual_seed(5)
    weights = {}
    for name, (shape, dtype) in CASES.items():
        weight = 0.02 * torch.randn(shape, generator=generator)
        weight.view(-1)[::97] *= 8
        weights[name] = weight.to(dtype)
    save_file(weights, str(tmp_path / "weights.safetensors"))
    harness.run_plait("nf4", weights=tmp_path / "weights.safetensors",
                      out=tmp_path / "plait.safetensors")
    return weights, load_file(str(tmp_path / "plait.safetensors"))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return nf4_case(tmp_path_factory.mktemp("nf4"))


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("double_quant", [False, True])
def test_nf4_matches_bitsandbytes(results, case, double_quant):
    weights, plait = results
    weight = weights[case]
    packed, state = bnb.quantize_4bit(weight, blocksize=64, quant_type="nf4",
                                      compress_statistics=double_quant)
    prefix = f"{case}.nf4dq." if double_quant else f"{case}.nf4."
    assert torch.equal(plait[prefix + "packed"],
                       packed.reshape(-1).to(torch.int64))
    if double_quant:
        assert torch.equal(plait[prefix + "absmax_codes"],
                           state.absmax.to(torch.int64))
        assert torch.equal(plait[prefix + "absmax_scales"],
                           state.state2.absmax)
        assert torch.equal(plait[prefix + "absmax_offset"],
                           state.offset.reshape(1))
    else:
        assert torch.equal(plait[prefix + "absmax"], state.absmax)
    dequantized = generic_dequantize_4bit(packed, state)
    assert dequantized.dtype == weight.dtype
    assert torch.equal(plait[prefix + "dequantized"], dequantized)
    if weight.shape[-1] % 64 == 0:
        assert torch.equal(plait[prefix + "dequantized"],
                           bnb.dequantize_4bit(packed, state))
