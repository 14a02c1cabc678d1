"""refcg: the reference external-codegen (BYOC) backend for quantized Relay models.

``import refcodegen`` registers ``relay.ext.refcg`` (and its constant updater) and the
``refcg`` pattern table. Flow: partition.py -> scoped_fold.py -> plan.py -> emit.py
(templates/) -> C core (runtime/), wired together in codegen.py.
"""
import os

os.environ.setdefault("TOPHUB_LOCATION", "NONE")  # relay.build would try to download tuning logs

from . import codegen  # noqa: E402  registers relay.ext.refcg
from .errors import RefcgError  # noqa: E402
from .partition import partition_for_refcg  # noqa: E402
from .report import OffloadReport, offload_report  # noqa: E402

__version__ = "0.1.0"
__all__ = ["partition_for_refcg", "offload_report", "OffloadReport", "RefcgError"]
