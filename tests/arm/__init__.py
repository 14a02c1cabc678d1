"""Helpers for the emulated aarch64 test host (tools/arm/setup.sh builds it)."""
