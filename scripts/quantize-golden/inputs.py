"""The golden inputs: 8 rows of 512 weights shaped as real weights are (and
as they are not: zeros, tiny, one-signed, sparse, outliers), and an
importance vector with zeros and a wide range. Deterministic (Python's
Mersenne Twister with a fixed seed)."""
import random
import struct
import sys

ROWS, COLS = 8, 512
rng = random.Random(20261201)
rows = [
    [rng.gauss(0, 0.02) for _ in range(COLS)],
    [rng.gauss(0, 1.0) for _ in range(COLS)],
    [rng.gauss(0, 0.02) * (25 if rng.random() < 0.01 else 1) for _ in range(COLS)],
    [rng.uniform(-1, 1) for _ in range(COLS)],
    [0.0] * COLS,
    [abs(rng.gauss(0, 0.5)) for _ in range(COLS)],
    [rng.gauss(0, 1e-6) for _ in range(COLS)],
    [rng.gauss(0, 0.1) if rng.random() < 0.1 else 0.0 for _ in range(COLS)],
]
imatrix = [0.0 if rng.random() < 0.03 else rng.lognormvariate(0, 1.5) for _ in range(COLS)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack(f"<{ROWS * COLS}f", *[x for r in rows for x in r]))
with open(sys.argv[2], "wb") as f:
    f.write(struct.pack(f"<{COLS}f", *imatrix))
