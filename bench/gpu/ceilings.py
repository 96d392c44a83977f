#!/usr/bin/env python3
"""The two ceilings the GPU benchmark figures are read against, measured on the device
itself (CUDA events, warm-up, median of 20, random data): a bf16 8192^3 matrix product
through PyTorch (cuBLAS) and a device-to-device copy of 2 GiB (bytes read plus written).
Prints one JSON line; run_bench.py's table quotes it."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_rows import time_ms  # noqa: E402  (CUDA events, warm-up, median)


def median_ms(fn, iters=20, warmup=3):
    return time_ms(fn, warmup, iters)[0]


def main():
    n = 8192
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    mm = median_ms(lambda: x @ y)
    src = torch.randn(1 << 29, device="cuda")  # 2 GiB of float32
    dst = torch.empty_like(src)
    cp = median_ms(lambda: dst.copy_(src))
    print(json.dumps({"device": torch.cuda.get_device_name(0),
                      "bf16_matmul_tflops": 2 * n ** 3 / (mm * 1e9),
                      "d2d_copy_tb_s": 2 * src.numel() * 4 / (cp * 1e9),
                      "torch": torch.__version__,
                      "cudnn": torch.backends.cudnn.version()}))


if __name__ == "__main__":
    main()
