"""longhaul's trainer side: hand pseudo-gradients to this site's agent and
get the average over the job's sites back (see README.md).

``longhaul.client`` is the API (NumPy or any buffer), ``longhaul.diloco``
DiLoCo's outer loop on a flat parameter vector, ``longhaul.torch`` the
PyTorch adapter (imported only when asked for: torch is optional).
"""

from longhaul.client import CaughtUp, Collected, CollectTimeout, Fragment, LonghaulError, Schedule, Session, TrainerClient
from longhaul.diloco import DiLoCo, NesterovSGD, RoundRecord

__all__ = [
    "CaughtUp",
    "Collected",
    "CollectTimeout",
    "DiLoCo",
    "Fragment",
    "LonghaulError",
    "NesterovSGD",
    "RoundRecord",
    "Schedule",
    "Session",
    "TrainerClient",
]
__version__ = "0.1.0"
