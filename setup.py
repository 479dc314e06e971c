"""ipcount's two compiled helpers, both optional: everything else is in pyproject.toml.

ipcount.source._fastread copies a read task's record values from librdkafka straight into Arrow
buffers; ipcount.formats._prefix_scan checks a chunk's lines against the access-log grammar,
cuts their client and $time_local texts and groups the distinct ones (see their sources). They
are built where a C compiler and Python's headers are found; where they are not, the build goes
on without them and the read tasks take confluent-kafka's messages and Arrow's kernels (RE2,
substrings), with the same verdicts (tests/integration/source/test_native_reads.py,
tests/unit/formats/test_parse_parity.py).
`job.native_helpers` chooses.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ipcount.source._fastread",
            ["ipcount/source/_fastread.c"],
            libraries=["dl"],
            extra_compile_args=["-O2", "-Wall"],
            optional=True,
        ),
        Extension(
            "ipcount.formats._prefix_scan",
            ["ipcount/formats/_prefix_scan.c"],
            extra_compile_args=["-O2", "-Wall"],
            optional=True,
        ),
    ]
)
