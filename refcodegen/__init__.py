"""refcg: the reference external-codegen (BYOC) backend for quantized Relay models.

``import refcodegen`` registers ``relay.ext.refcg`` (and its constant updater) and the
``refcg`` pattern table. Flow: partition.py -> scoped_fold.py -> plan.py -> emit.py
(templates/) -> C core (runtime/), wired together in codegen.py; each op family's patterns,
check and plan live in ops/<family>.py.
"""
import importlib.util
import os
import sys

os.environ.setdefault("TOPHUB_LOCATION", "NONE")  # relay.build would try to download tuning logs
# refcg loads TVM's LLVM. triton (installed with CUDA builds of torch, imported by torch._dynamo,
# e.g. from torchvision) carries another LLVM, and loaded after TVM's it crashes the process.
# Unless it is loaded already, its import fails as if it were not installed: torch goes without it.
if "triton" not in sys.modules and importlib.util.find_spec("triton") is not None:
    sys.modules["triton"] = None

from . import codegen  # noqa: E402  registers relay.ext.refcg
from .errors import RefcgError  # noqa: E402
from .partition import partition_for_refcg  # noqa: E402
from .report import OffloadReport, offload_report  # noqa: E402

__version__ = "0.1.0"
__all__ = ["partition_for_refcg", "offload_report", "OffloadReport", "RefcgError"]
