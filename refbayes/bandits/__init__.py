"""Contextual bandits on top of refbayes filters (Duran-Martin, Kara & Murphy 2022).

environments: offline bandit tables (classification, wheel, ratings); agents:
the subspace EKF and its baselines; run: the Online-Eval loop and comparisons.
"""

from types import ModuleType as _ModuleType

# tests/test_bandits.py and validation/bandits.py import many of these names, in the same sorted order:
# import lists alike in shape, not logic to share
from .agents import (
    Agent,
    LiM2Agent,
    LinearTSAgent,
    LoFiAgent,
    NeuralGreedyAgent,
    NeuralLinearAgent,
    NeuralTSAgent,
    OracleAgent,
    OrigEKFAgent,
    RandomAgent,
    SubspaceAgent,
    mlp_features,
    pgd_covariance,
    thompson_params,
    ucb_scores,
)
from .environments import (
    BanditEnvironment,
    Warmup,
    classification_bandit,
    ratings_bandit,
    sklearn_bandit,
    wheel_bandit,
)
from .memory import Memory
from .reward_model import ArmModel
from .run import BanditResult, compare_agents, run_bandit

# The public names are exactly the ones imported above: one list to keep, not two.
__all__ = sorted(name for name, value in globals().items()
                 if not name.startswith("_") and not isinstance(value, _ModuleType))
