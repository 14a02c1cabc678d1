"""The one error type refcg raises for input it cannot compile."""
from tvm.error import TVMError


class RefcgError(TVMError):
    """Names the op, the attribute and the reason; subclasses TVM's error type."""

    def __init__(self, op: str, attribute: str, reason: str):
        self.op, self.attribute, self.reason = op, attribute, reason
        super().__init__(f"refcg: {op}: {attribute}: {reason}")
