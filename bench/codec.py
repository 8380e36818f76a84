"""Codec throughput: encode and decode of a healthy bookie share (E=3, WQ=2) and of random ids,
against a plain Python loop doing the same work, in one run.

    python -m bench.codec [--sizes 1000000,10000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import struct
from functools import partial

import numpy as np

from bench.common import median_seconds, table
from scrutiny import codec


def python_encode(ids: list[int]) -> bytes:
    """The baseline: BP-34's greedy encoder as a plain loop over sorted ids."""
    runs: list[tuple[int, int]] = []
    for e in ids:
        if runs and e == runs[-1][0] + runs[-1][1]:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        elif not runs or e > runs[-1][0] + runs[-1][1] - 1:
            runs.append((e, 1))
    groups = []
    i = 0
    while i < len(runs):
        first, size = runs[i]
        last, period, j = first, 0, i + 1
        if j < len(runs) and runs[j][1] == size:
            period = runs[j][0] - first
            last = runs[j][0]
            j += 1
            while j < len(runs) and runs[j][1] == size and runs[j][0] - last == period:
                last = runs[j][0]
                j += 1
        groups.append((first, last, size, period))
        i = j
    return struct.pack(">ii", 0, len(groups)) + bytes(56) + b"".join(struct.pack(">qqii", *g) for g in groups)


def python_decode(data: bytes) -> list[int]:
    """The baseline decoder: expands every id."""
    (n,) = struct.unpack_from(">i", data, 4)
    out: list[int] = []
    for k in range(n):
        first, last, size, period = struct.unpack_from(">qqii", data, 64 + 24 * k)
        start = first
        while True:
            out.extend(range(start, start + size))
            if start == last:
                break
            start += period
    return out


def decode_and_expand(data: bytes, limit: int) -> object:
    return codec.decode(data).entry_ids(limit=limit)


def run(sizes: list[int], repeats: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    rng = np.random.default_rng(34)
    for n in sizes:
        ids = np.arange(n, dtype=np.int64)
        shapes = {"healthy share": ids[(0 - ids) % 3 < 2],
                  "random 90%": np.sort(rng.choice(n, size=int(n * 0.9), replace=False))}
        for shape, arr in shapes.items():
            as_list = arr.tolist()
            enc = codec.encode(arr)
            assert enc == python_encode(as_list)
            t_enc = median_seconds(partial(codec.encode, arr), repeats)
            t_enc_py = median_seconds(partial(python_encode, as_list), max(1, repeats // 2))
            t_dec = median_seconds(partial(codec.decode, enc), repeats)
            t_exp = median_seconds(partial(decode_and_expand, enc, n), repeats)
            t_dec_py = median_seconds(partial(python_decode, enc), max(1, repeats // 2))
            rows.append({"ids": n, "shape": shape, "groups": (len(enc) - 64) // 24,
                         "encode s": t_enc, "python encode s": t_enc_py, "encode speed-up": t_enc_py / t_enc,
                         "decode s": t_dec, "decode+expand s": t_exp, "python decode s": t_dec_py,
                         "decode+expand speed-up": t_dec_py / t_exp})
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1000000,10000000")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    print(table(run([int(s) for s in a.sizes.split(",")], a.repeats)))


if __name__ == "__main__":
    main()
