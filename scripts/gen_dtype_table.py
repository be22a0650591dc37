#!/usr/bin/env python3
"""Write torch's float8_e4m3fn -> float32 conversion of all 256 codes.

Output: tests/fixtures/dtype/f8_e4m3fn.f32, 256 raw little-endian float32 values, entry i
= torch.tensor([i], dtype=uint8).view(torch.float8_e4m3fn).float(). tests/unit/test_dtype.cpp
checks charm's f8e4m3_to_f32 against it bit for bit (NaN codes: both NaN).

Usage: python3 scripts/gen_dtype_table.py     (needs torch)
"""

from pathlib import Path

import torch

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "dtype" / "f8_e4m3fn.f32"


def main() -> None:
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    values = codes.view(torch.float8_e4m3fn).to(torch.float32)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    values.numpy().astype("<f4").tofile(OUT)
    print(f"wrote {OUT} ({values.numel()} values, torch {torch.__version__}); "
          f"max {values[~values.isnan()].max().item()}, NaN codes "
          f"{[i for i in range(256) if values[i].isnan()]}")


if __name__ == "__main__":
    main()
