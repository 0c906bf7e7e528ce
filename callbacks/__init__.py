"""Lightning callbacks of ibpo-lit. Each is independent; none imports another."""
from callbacks.correction import CorrectionRollouts

__all__ = ["CorrectionRollouts"]
