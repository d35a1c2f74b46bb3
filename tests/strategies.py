"""Every Hypothesis strategy of the suite."""

from __future__ import annotations

import math

from hypothesis import strategies as st

from eaglectl.io.safetensors import DTYPE_BITS

names = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF, exclude_characters='"\\'), min_size=1,
                max_size=24).filter(lambda s: s != "__metadata__")
byte_dtypes = st.sampled_from(sorted(d for d, b in DTYPE_BITS.items() if b % 8 == 0))
shapes = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)
metadata = st.none() | st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3)


@st.composite
def tensor_specs(draw):
    """A list of (name, dtype, shape, data) with unique names and matching byte lengths."""
    specs = draw(st.lists(st.tuples(names, byte_dtypes, shapes), max_size=5, unique_by=lambda t: t[0]))
    out = []
    for name, dtype, shape in specs:
        n = math.prod(shape) * DTYPE_BITS[dtype] // 8
        out.append((name, dtype, shape, draw(st.binary(min_size=n, max_size=n))))
    return out
