#!/usr/bin/env python3
"""Transcribe the IQ grid and sign tables of ggml-common.h into Rust.

usage: scripts/gen-iq-grids.py path/to/ggml/src/ggml-common.h [path/to/gguf-py] > core/src/quant/iq_grids.rs
The tables are data (GGUF's definition of the formats); this only copies values.
"""
import re
import sys

src = open(sys.argv[1]).read()


def table(name):
    m = re.search(r"GGML_TABLE_BEGIN\(\w+, " + name + r", \w+\)(.*?)GGML_TABLE_END\(\)", src, re.S)
    return [int(v, 0) for v in re.findall(r"0x[0-9a-fA-F]+|\d+", m.group(1))]


out = [
    "//! Grid and sign tables of the IQ1/IQ2 formats, transcribed from llama.cpp's",
    "//! `ggml/src/ggml-common.h` (0c1e570) by `scripts/gen-iq-grids.py`: data, not",
    "//! code. A grid entry holds 8 weights, byte `j` (little-endian) weight `j`:",
    "//! unsigned magnitudes 8, 25, 43 for IQ2, signed -1, 0, 1 for IQ1.",
    "",
    "// Generated: do not edit by hand.",
    "",
]


def emit(rust, cname, ty, fmt, per_line):
    vals = table(cname)
    out.append(f"pub static {rust}: [{ty}; {len(vals)}] = [")
    for i in range(0, len(vals), per_line):
        out.append("    " + " ".join(fmt.format(v) + "," for v in vals[i:i + per_line]))
    out.append("];")
    out.append("")


out.append("/// Sign patterns of IQ2_XXS / IQ2_XS: 7 stored bits, the 8th makes the")
out.append("/// number of minus signs even. Bit `j` set: weight `j` is negative.")
emit("KSIGNS_IQ2XS", "ksigns_iq2xs", "u8", "{:3}", 16)
for rust, c in [("IQ2XXS_GRID", "iq2xxs_grid"), ("IQ2XS_GRID", "iq2xs_grid"), ("IQ2S_GRID", "iq2s_grid"),
                ("IQ1S_GRID", "iq1s_grid")]:
    emit(rust, c, "u64", "0x{:016x}", 4)

# Cross-check against gguf-py's own copies of the grids (packed 2 bits a value),
# when its directory is given: gguf-py is the reference dequantisation.
if len(sys.argv) > 2:
    sys.path.insert(0, sys.argv[2])
    import numpy as np
    from gguf import quants

    for cls, cname in [(quants.IQ2_XXS, "iq2xxs_grid"), (quants.IQ2_XS, "iq2xs_grid"), (quants.IQ2_S, "iq2s_grid"),
                       (quants.IQ1_S, "iq1s_grid")]:
        cls.init_grid()
        c = np.array(table(cname), dtype=np.uint64).view(np.uint8).view(np.int8 if cname == "iq1s_grid" else np.uint8)
        assert (c.reshape(-1, 8).astype(np.float32) == cls.grid.reshape(-1, 8)).all(), cname
    assert bytes(table("ksigns_iq2xs")) == quants.IQ2_XXS.ksigns
print("\n".join(out).rstrip() + "\n", end="")
