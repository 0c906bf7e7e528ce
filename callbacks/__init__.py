"""Lightning callbacks of ibpo-lit. Each is independent; none imports another."""
from callbacks.compute_budget import ComputeBudgetStopper
from callbacks.correction import CorrectionRollouts
from callbacks.correction_metrics import CorrectionMetrics
from callbacks.gradient_variance import GradientVarianceLogger
from callbacks.rollout_samples import RolloutSamples
from callbacks.weight_sync import StaleWeightsError, VLLMWeightSync

__all__ = ["ComputeBudgetStopper", "CorrectionMetrics", "CorrectionRollouts", "GradientVarianceLogger", "RolloutSamples", "StaleWeightsError", "VLLMWeightSync"]
