"""The fuzz: random valid QNN chains (``chains``), built and compared bit-exact with TVM-only
(``check``), on x86 here or on the emulated aarch64 host (``arm``). ``python -m fuzzing`` (run from
tests/; ``make fuzz``, ``make fuzz-arm``) runs campaigns; tests/test_fuzz.py runs a bounded one."""

import conftest  # noqa: E402,F401  first, as under pytest: it puts the checkout (examples/) on sys.path
