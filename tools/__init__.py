"""Developer tools (demo, bench): not shipped. Run from the repository root as modules,
``python -m tools.demo``, so that ``examples`` (the example models) and ``refcodegen`` import from the checkout."""
