#!/usr/bin/env python3
"""Writes tests/fixtures/mxfp4/cases.json: gpt-oss's MXFP4 expert tensors as the hub ships
them (`*_blocks` uint8 [E, R, G, 16], `*_scales` uint8 E8M0 [E, R, G]) with transformers'
own dequantisation of them (transformers.integrations.mxfp4.convert_moe_packed_tensors, in
float32: [E, G*32, R], the layout GptOssExperts multiplies by), the oracle for charm's
reader (common/mxfp4.h, the gpt-oss expert reader).

Random bytes from a fixed seed; scales mostly near 127 (values near 1) plus the extremes a
checkpoint may hold (0, 1, 126, 127, 128, 140). Deterministic.
Needs torch and transformers (e.g. /work/venv-tf). Usage: scripts/gen_mxfp4_cases.py
"""
import json
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

OUT = Path(__file__).resolve().parent.parent / "tests/fixtures/mxfp4/cases.json"


def main() -> None:
    rng = np.random.default_rng(20261202)
    E, R, G = 2, 6, 3  # experts, rows (output features), 32-element groups per row
    blocks = rng.integers(0, 256, size=(E, R, G, 16), dtype=np.uint8)
    scales = rng.integers(118, 136, size=(E, R, G), dtype=np.uint8)
    scales.flat[:6] = [0, 1, 126, 127, 128, 140]
    out = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
    assert tuple(out.shape) == (E, G * 32, R), out.shape
    doc = {"_source": f"transformers {transformers.__version__} integrations.mxfp4.convert_moe_packed_tensors"
                      "(blocks, scales, dtype=float32)",
           "experts": E, "rows": R, "groups": G,
           "blocks_hex": blocks.tobytes().hex(), "scales_hex": scales.tobytes().hex(),
           "dequantized_f32_hex": out.numpy().astype("<f4").tobytes().hex()}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
